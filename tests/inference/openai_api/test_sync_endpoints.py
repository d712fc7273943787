"""/v1/embeddings, /v1/rerank, /v1/chat/completions, /v1/completions and /v1/models through the
official `openai` client, each request one renq job run by a real GPU worker."""

from __future__ import annotations

import base64
import math
import struct

import pytest
import requests

from inference.models import Job, JobStatus
from tests.conftest import wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TEXTS = ["a cat sits on the mat", "quarterly tax forms", "hello world"]


def test_embeddings_float_and_base64_equal_the_job_api(gpu_worker, client, api):
    floats = client.embeddings.create(model="embedding", input=TEXTS, encoding_format="float")
    packed = client.embeddings.create(model="embedding", input=TEXTS, encoding_format="base64")
    # The SDK's default (no encoding_format) asks for base64 and decodes it itself.
    default = client.embeddings.create(model="embedding", input=TEXTS[0])

    response = api.post(
        "/api/v1/jobs",
        {"service": "embedding", "priority": "realtime", "input": {"texts": TEXTS}},
        format="json",
    )
    expected = wait_for_job(response.json()["id"]).embedding_matrix().tolist()

    assert floats.object == "list" and floats.model == "embedding"
    assert [item.index for item in floats.data] == [0, 1, 2]
    assert floats.usage.prompt_tokens > 0 and floats.usage.total_tokens > 0
    for item, want in zip(floats.data, expected, strict=True):
        assert max(abs(a - b) for a, b in zip(item.embedding, want, strict=True)) < 1e-5
    for item, want in zip(packed.data, expected, strict=True):
        raw = base64.b64decode(item.embedding)
        got = struct.unpack(f"<{len(raw) // 4}f", raw)
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-5
    decoded = default.data[0].embedding
    assert max(abs(a - b) for a, b in zip(decoded, expected[0], strict=True)) < 1e-5


def test_embeddings_base64_is_the_stored_bytes(gpu_worker, client):
    raw = client.embeddings.with_raw_response.create(
        model="embedding", input=TEXTS, encoding_format="base64"
    )
    # The answer comes just before its store: the row once stored.
    stored = bytes(wait_for_job(raw.headers["X-Renq-Job-Id"]).result_vectors)
    row = len(stored) // len(TEXTS)
    assert row == 384 * 4
    sent = [base64.b64decode(item.embedding) for item in raw.parse().data]
    assert sent == [stored[i * row : (i + 1) * row] for i in range(len(TEXTS))]


def test_embeddings_dimensions_truncate_and_renormalise(gpu_worker, client):
    full = client.embeddings.create(model="embedding", input="hello", encoding_format="float")
    short = client.embeddings.create(
        model="embedding", input="hello", encoding_format="float", dimensions=64
    )
    vector = short.data[0].embedding
    assert len(vector) == 64
    assert abs(math.sqrt(sum(v * v for v in vector)) - 1) < 1e-5
    head = full.data[0].embedding[:64]
    norm = math.sqrt(sum(v * v for v in head))
    assert max(abs(a - b / norm) for a, b in zip(vector, head, strict=True)) < 1e-5


def test_response_headers_name_the_job_and_its_wait(gpu_worker, client, front_door_url):
    raw = client.embeddings.with_raw_response.create(
        model="embedding",
        input="hi",
        extra_headers={"X-Renq-Priority": "realtime", "X-Renq-Deadline-Ms": "30000"},
    )
    # A realtime answer comes before its row is stored (a store later).
    job = wait_for_job(raw.headers["X-Renq-Job-Id"], timeout_s=10)
    assert job.status == JobStatus.SUCCEEDED and job.tier == "realtime"
    assert raw.headers["X-Renq-Backend"] == "local"
    assert float(raw.headers["X-Renq-Queue-Wait-Ms"]) >= 0


def test_rerank_in_the_cohere_shape(gpu_worker, services, tenant_key, front_door_url):
    body = {
        "model": "reranker",
        "query": "what is a cat",
        "documents": ["a cat is an animal", {"text": "tax forms are due"}, "cats purr"],
        "top_n": 2,
        "return_documents": True,
    }
    response = requests.post(
        f"{front_door_url}/v1/rerank",
        json=body,
        headers={"Authorization": f"Bearer {tenant_key}"},
        timeout=60,
    )
    assert response.status_code == 200, response.text
    answer = response.json()
    assert len(answer["results"]) == 2
    scores = [r["relevance_score"] for r in answer["results"]]
    assert scores == sorted(scores, reverse=True)
    assert all(r["document"]["text"] for r in answer["results"])
    assert answer["usage"]["total_tokens"] > 0


def test_chat_completion_and_text_completion(gpu_worker, client):
    chat = client.chat.completions.create(
        model="llm",
        messages=[
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "say hello"},
        ],
        max_tokens=5,
        temperature=0,
    )
    choice = chat.choices[0]
    assert chat.object == "chat.completion" and chat.model == "llm"
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= chat.usage.completion_tokens <= 5
    assert chat.usage.total_tokens == chat.usage.prompt_tokens + chat.usage.completion_tokens
    # No chat template in the tiny model: the documented "role: content" fallback.
    job = Job.objects.get(pk=chat.id.removeprefix("chatcmpl-"))
    assert job.input["prompt"] == "system: be brief\nuser: say hello\nassistant:"

    text = client.completions.create(
        model="llm", prompt="once upon a time", max_tokens=4, temperature=0
    )
    assert text.object == "text_completion"
    assert 1 <= text.usage.completion_tokens <= 4


def test_stop_sequences_cut_the_text(gpu_worker, client):
    plain = client.completions.create(model="llm", prompt="the", max_tokens=8, temperature=0)
    generated = plain.choices[0].text
    if len(generated.strip()) < 2:
        pytest.skip("the tiny model generated too little text to cut")
    stop = generated.strip()[1:3]
    cut = client.completions.create(
        model="llm", prompt="the", max_tokens=8, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == generated[: generated.find(stop)]
    assert cut.choices[0].finish_reason == "stop"


def test_models_lists_the_services(client):
    assert sorted(model.id for model in client.models.list()) == ["embedding", "llm", "reranker"]
    assert client.models.retrieve("llm").id == "llm"
