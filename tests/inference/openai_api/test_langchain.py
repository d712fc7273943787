"""LangChain's OpenAI integrations against the front door, as their users configure them for
an OpenAI-compatible server: embeddings, and chat both whole and streamed."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_openai_embeddings(gpu_worker, services, tenant_key, front_door_url):
    from langchain_openai import OpenAIEmbeddings

    # Off: LangChain would otherwise send tiktoken token ids, which only OpenAI's models read.
    embeddings = OpenAIEmbeddings(
        model="embedding",
        base_url=f"{front_door_url}/v1",
        api_key=tenant_key,
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    vectors = embeddings.embed_documents(["a cat sits on the mat", "quarterly tax forms"])
    query = embeddings.embed_query("a cat sits on the mat")
    assert len(vectors) == 2 and len(vectors[0]) == len(query) == 384
    assert vectors[0] == pytest.approx(query, abs=1e-5)


def test_chat_openai_invoke_and_stream(gpu_worker, services, tenant_key, front_door_url):
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model="llm",
        base_url=f"{front_door_url}/v1",
        api_key=tenant_key,
        max_tokens=6,
        temperature=0,
        max_retries=0,
    )
    whole = chat.invoke("say hello")
    assert isinstance(whole.content, str)
    assert whole.usage_metadata["output_tokens"] >= 1
    chunks = list(chat.stream("say hello"))
    assert len(chunks) >= 2  # text, then the finish reason at least
    assert "".join(chunk.content for chunk in chunks) == whole.content
