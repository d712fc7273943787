"""Streaming from the worker: chunks carry text as it is generated, before the job ends."""

from __future__ import annotations

import time

import pytest

from inference.models import Job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_chat_completion_streams_chunks_before_the_job_ends(gpu_worker, client):
    stream = client.chat.completions.create(
        model="llm",
        messages=[{"role": "user", "content": "tell me a long story"}],
        max_tokens=48,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts, finish, usage, first_at = [], None, None, None
    job_running_at_first_chunk = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            assert chunk.object == "chat.completion.chunk"
            if choice.delta.content:
                if first_at is None:
                    first_at = time.monotonic()
                    job = Job.objects.get(pk=chunk.id.removeprefix("chatcmpl-"))
                    job_running_at_first_chunk = job.status == "running"
                texts.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    job = Job.objects.get(pk=chunk.id.removeprefix("chatcmpl-"))
    assert job.status == "succeeded"
    # Tokens came from the worker as they were generated, not the finished text cut up.
    assert job_running_at_first_chunk is True
    assert len(texts) > 1
    assert "".join(texts) == job.result["text"]
    assert job.result["first_token_ms"] > 0
    assert finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens == job.result["usage"]["completion_tokens"]


def test_text_completion_streams_too(gpu_worker, client):
    stream = client.completions.create(
        model="llm", prompt="once upon a time", max_tokens=12, temperature=0, stream=True
    )
    chunks = list(stream)
    assert all(c.object == "text_completion" for c in chunks)
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_embeddings_do_not_stream(client):
    import openai

    with pytest.raises(openai.BadRequestError) as refused:
        client.embeddings.create(model="embedding", input="x", extra_body={"stream": True})
    assert refused.value.body["param"] == "stream"
