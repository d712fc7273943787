"""The OpenAI-compatible adapter over real HTTP: official response shapes, and every upstream
failure translated to the error the cascade needs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from routing.backends import adapter_for
from routing.backends.base import (
    BackendMisconfigured,
    BackendTimeout,
    BackendUnavailable,
    UpstreamBadInput,
    UpstreamMalformed,
    UpstreamRateLimited,
    UpstreamServerError,
)
from tests.routing_fixtures import FAKE_API_KEY

pytestmark = pytest.mark.django_db
SAMPLES = Path(__file__).with_name("openai_samples")


def sample(name: str) -> dict:
    return json.loads((SAMPLES / name).read_text())


@pytest.fixture
def cloud(make_backend):
    return make_backend("cloud", timeout_s=0.5)


def test_official_embeddings_response(cloud, upstream):
    upstream.script("cloud", mode="raw", body=sample("embeddings.json"))
    answer = adapter_for(cloud).call({"texts": ["The food was delicious"]}, "embedding")
    assert answer.result == {
        "embeddings": [[0.0023064255, -0.009327292, 0.015797347, -0.0028842222]],
        "dim": 4,
    }
    assert answer.input_tokens == 8
    call = upstream.calls("cloud")[0]
    assert call["path"] == "/v1/embeddings"
    assert call["body"] == {"model": "cloud-model", "input": ["The food was delicious"]}
    assert call["auth"] == f"Bearer {FAKE_API_KEY}"


def test_embeddings_of_different_lengths_are_malformed(cloud, upstream):
    # renq stores a job's vectors as one count × dim float32 matrix.
    body = sample("embeddings.json")
    body["data"] = [
        {"object": "embedding", "index": 0, "embedding": [0.1, 0.2]},
        {"object": "embedding", "index": 1, "embedding": [0.1]},
    ]
    upstream.script("cloud", mode="raw", body=body)
    with pytest.raises(UpstreamMalformed, match="different lengths"):
        adapter_for(cloud).call({"texts": ["a", "b"]}, "embedding")


def test_official_chat_completion_response(cloud, upstream):
    upstream.script("cloud", mode="raw", body=sample("chat_completion.json"))
    answer = adapter_for(cloud).call({"prompt": "Hello!", "max_tokens": 16}, "llm")
    assert answer.result == {
        "text": "Hello! How can I assist you today?",
        "usage": {"prompt_tokens": 19, "completion_tokens": 10},
        "finish_reason": "stop",
    }
    assert (answer.input_tokens, answer.output_tokens) == (19, 10)
    body = upstream.calls("cloud")[0]["body"]
    assert body["messages"] == [{"role": "user", "content": "Hello!"}]
    assert body["max_tokens"] == 16


@pytest.mark.parametrize("name", ["rerank_cohere.json", "rerank_jina.json"])
def test_official_rerank_responses(cloud, upstream, name):
    body = sample(name)
    upstream.script("cloud", mode="raw", body=body)
    documents = ["a", "b", "c"][: len(body["results"])]
    answer = adapter_for(cloud).call({"query": "q", "documents": documents}, "reranker")
    ranked = sorted(body["results"], key=lambda r: -r["relevance_score"])
    assert answer.result["ranking"] == [r["index"] for r in ranked]
    for row in body["results"]:
        assert answer.result["scores"][row["index"]] == row["relevance_score"]


def test_fake_upstream_answers_in_the_same_shapes(cloud, upstream):
    adapter = adapter_for(cloud)
    embedded = adapter.call({"texts": ["x", "y z"]}, "embedding").result
    assert [len(v) for v in embedded["embeddings"]] == [8, 8]
    ranked = adapter.call({"query": "cat", "documents": ["dog", "a cat"]}, "reranker").result
    assert ranked["ranking"] == [1, 0]
    assert adapter.call({"prompt": "hi"}, "llm").result["text"].startswith("fake answer")


@pytest.mark.parametrize(
    ("script", "error", "retryable"),
    [
        ({"mode": "429", "retry_after": 2}, UpstreamRateLimited, True),
        ({"mode": "500"}, UpstreamServerError, True),
        ({"mode": "400"}, UpstreamBadInput, False),
        ({"mode": "malformed"}, UpstreamMalformed, True),
        ({"mode": "hang", "hang_s": 2}, BackendTimeout, True),
    ],
)
def test_upstream_failures_become_backend_errors(cloud, upstream, script, error, retryable):
    upstream.script("cloud", **script)
    with pytest.raises(error) as caught:
        adapter_for(cloud).call({"texts": ["x"]}, "embedding")
    assert caught.value.retryable is retryable


def test_429_carries_the_headers_for_the_cooldown(cloud, upstream):
    upstream.script("cloud", mode="429", retry_after=7)
    with pytest.raises(UpstreamRateLimited) as caught:
        adapter_for(cloud).call({"texts": ["x"]}, "embedding")
    assert {k.lower(): v for k, v in caught.value.headers.items()}["retry-after"] == "7"
    assert caught.value.status_code == 429


def test_connection_refused_is_unavailable(make_backend):
    dead = make_backend("dead", base_url="http://127.0.0.1:9/v1")
    with pytest.raises(BackendUnavailable):
        adapter_for(dead).call({"texts": ["x"]}, "embedding")


def test_missing_api_key_variable_is_a_config_error(make_backend, monkeypatch):
    backend = make_backend("keyless", api_key_env="RENQ_TEST_UNSET_KEY")
    monkeypatch.delenv("RENQ_TEST_UNSET_KEY", raising=False)
    with pytest.raises(BackendMisconfigured, match="RENQ_TEST_UNSET_KEY"):
        adapter_for(backend).call({"texts": ["x"]}, "embedding")
