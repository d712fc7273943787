"""Adapter for OpenAI-compatible HTTP APIs: /embeddings, /chat/completions and /rerank.

Requests and responses follow OpenAI's API reference (embeddings, chat completions) and the
Cohere/Jina shape for rerank. Results are turned into renq's own result shapes, so a client
cannot tell a cloud answer from a local one except by the job's `backend`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import requests
from requests.adapters import HTTPAdapter

from routing.backends.base import (
    AdapterResult,
    BackendAdapter,
    BackendMisconfigured,
    BackendTimeout,
    BackendUnavailable,
    UpstreamBadInput,
    UpstreamMalformed,
    UpstreamRateLimited,
    UpstreamRejected,
    UpstreamServerError,
)

# One pooled session per process; a thread pool of I/O workers shares its connections.
POOL_MAXSIZE = 64
# 4xx that say the input itself is wrong: no other backend will accept it either.
BAD_INPUT_STATUSES = frozenset({400, 413, 422})

_session: requests.Session | None = None
_session_pid: int | None = None
_session_lock = threading.Lock()


def http_session() -> requests.Session:
    """The process's pooled session, recreated after a fork (sockets must not be shared)."""
    global _session, _session_pid
    with _session_lock:
        if _session is None or _session_pid != os.getpid():
            session = requests.Session()
            # No transport retries: the cascade decides what a failure means.
            adapter = HTTPAdapter(pool_connections=16, pool_maxsize=POOL_MAXSIZE, max_retries=0)
            session.mount("http://", adapter)
            session.mount("https://", adapter)
            _session, _session_pid = session, os.getpid()
        return _session


@contextmanager
def translated_errors(name: str, timeout_s: float) -> Iterator[None]:
    """The one place where `requests` errors become BackendErrors."""
    try:
        yield
    except requests.Timeout as exc:
        raise BackendTimeout(f"{name}: no answer within {timeout_s:g} s ({exc})") from exc
    except requests.ConnectionError as exc:
        raise BackendUnavailable(f"{name}: connection failed ({exc})") from exc
    except requests.RequestException as exc:
        raise BackendUnavailable(f"{name}: request failed ({exc})") from exc


def error_for_status(name: str, response: requests.Response) -> None:
    status = response.status_code
    if status < 400:
        return
    detail = response.text[:300].strip()
    message = f"{name}: HTTP {status} {detail}".rstrip()
    kwargs: dict[str, Any] = {"status_code": status, "headers": dict(response.headers)}
    if status == 429:
        raise UpstreamRateLimited(message, **kwargs)
    if status >= 500:
        raise UpstreamServerError(message, **kwargs)
    if status in BAD_INPUT_STATUSES:
        raise UpstreamBadInput(message, **kwargs)
    if status == 408:
        raise BackendTimeout(message, **kwargs)
    raise UpstreamRejected(message, **kwargs)


# --- request bodies and response parsing, per service kind --------------------------------


def embeddings_request(model: str, payload: Mapping) -> tuple[str, dict]:
    return "/embeddings", {"model": model, "input": list(payload["texts"])}


def parse_embeddings(body: Mapping, payload: Mapping) -> tuple[dict, int, int]:
    """OpenAI `CreateEmbeddingResponse`: {"object": "list", "data": [{"object": "embedding",
    "index", "embedding"}], "model", "usage": {"prompt_tokens", "total_tokens"}}."""
    rows = sorted(body["data"], key=lambda row: row["index"])
    vectors = [[float(x) for x in row["embedding"]] for row in rows]
    if len(vectors) != len(payload["texts"]):
        raise ValueError(f"{len(vectors)} embeddings for {len(payload['texts'])} texts")
    if len({len(vector) for vector in vectors}) > 1:
        # renq stores a job's vectors as one count × dim float32 matrix.
        raise ValueError("embeddings of different lengths")
    usage = body.get("usage") or {}
    tokens = int(usage.get("prompt_tokens") or usage.get("total_tokens") or 0)
    return {"embeddings": vectors, "dim": len(vectors[0]) if vectors else 0}, tokens, 0


def chat_request(model: str, payload: Mapping) -> tuple[str, dict]:
    body = {"model": model, "messages": [{"role": "user", "content": payload["prompt"]}]}
    # renq's validation fills in the defaults; what a payload leaves out, the API decides.
    for name in ("max_tokens", "temperature"):
        if name in payload:
            body[name] = payload[name]
    return "/chat/completions", body


def parse_chat(body: Mapping, payload: Mapping) -> tuple[dict, int, int]:
    """OpenAI `chat.completion`: {"choices": [{"index", "message": {"role", "content"},
    "finish_reason"}], "usage": {"prompt_tokens", "completion_tokens", "total_tokens"}}."""
    choice = body["choices"][0]
    text = choice["message"].get("content") or ""
    if not isinstance(text, str):
        raise ValueError("message.content is not a string")
    usage = body.get("usage") or {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    completion_tokens = int(usage.get("completion_tokens") or 0)
    result = {
        "text": text,
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
        "finish_reason": choice.get("finish_reason") or "stop",
    }
    return result, prompt_tokens, completion_tokens


def rerank_request(model: str, payload: Mapping) -> tuple[str, dict]:
    body = {"model": model, "query": payload["query"], "documents": list(payload["documents"])}
    if payload.get("top_n") is not None:
        body["top_n"] = payload["top_n"]
    return "/rerank", body


def parse_rerank(body: Mapping, payload: Mapping) -> tuple[dict, int, int]:
    """Cohere/Jina: {"results": [{"index", "relevance_score"}], "usage": {"total_tokens"}}
    (Jina) or "meta": {"billed_units": {...}, "tokens": {"input_tokens"}} (Cohere)."""
    documents = payload["documents"]
    scores = [0.0] * len(documents)
    ranking = []
    for row in sorted(body["results"], key=lambda r: -float(r["relevance_score"])):
        index = int(row["index"])
        if not 0 <= index < len(documents):
            raise ValueError(f"result index {index} out of range")
        scores[index] = float(row["relevance_score"])
        ranking.append(index)
    usage = body.get("usage") or {}
    meta_tokens = (body.get("meta") or {}).get("tokens") or {}
    tokens = int(usage.get("total_tokens") or meta_tokens.get("input_tokens") or 0)
    return {"scores": scores, "ranking": ranking}, tokens, 0


ENDPOINTS = {
    "embedding": (embeddings_request, parse_embeddings),
    "llm": (chat_request, parse_chat),
    "reranker": (rerank_request, parse_rerank),
}


class OpenAIAdapter(BackendAdapter):
    service_kinds = tuple(ENDPOINTS)

    def missing_key_variable(self) -> str | None:
        """The name of the unset environment variable that should hold the key, if any."""
        backend = self.backend
        if backend.api_key_env and not backend.api_key():
            return backend.api_key_env
        return None

    def misconfiguration(self) -> str | None:
        # A backend that cannot authenticate fails every job: never choose it.
        missing = self.missing_key_variable()
        return f"environment variable {missing} is not set" if missing else None

    def unavailable_reason(self, request) -> str | None:
        # Its calls are made by the I/O workers: with none running, a job would strand.
        if request.workers.io_consumer_count() == 0:
            return "no I/O worker consuming the io queues"
        return None

    def call(self, job_payload: dict, service_kind: str) -> AdapterResult:
        backend = self.backend
        try:
            build, parse = ENDPOINTS[service_kind]
        except KeyError:
            raise BackendMisconfigured(f"{backend.name}: cannot serve {service_kind!r}") from None
        path, body = build(backend.model_name, job_payload)
        headers = {"Content-Type": "application/json"}
        if backend.api_key_env:
            missing = self.missing_key_variable()
            if missing:
                raise BackendMisconfigured(
                    f"{backend.name}: environment variable {missing} is not set"
                )
            headers["Authorization"] = f"Bearer {backend.api_key()}"
        url = backend.base_url.rstrip("/") + path
        started = time.perf_counter()
        with translated_errors(backend.name, backend.timeout_s):
            response = http_session().post(
                url,
                json=body,
                headers=headers,
                timeout=(backend.connect_timeout_s, backend.timeout_s),
            )
            content = response.content  # read here so a stalled body is a read timeout
        latency_s = time.perf_counter() - started
        error_for_status(backend.name, response)
        try:
            result, input_tokens, output_tokens = parse(response.json(), job_payload)
        except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise UpstreamMalformed(
                f"{backend.name}: malformed response ({type(exc).__name__}: {exc}): "
                f"{content[:120]!r}",
                status_code=response.status_code,
                headers=dict(response.headers),
            ) from exc
        return AdapterResult(
            result=result,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            status_code=response.status_code,
            headers=dict(response.headers),
            latency_s=latency_s,
        )
