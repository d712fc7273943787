"""The OpenAI endpoints as renq jobs: a request body → a job input, a finished job → the body
OpenAI would answer. Used by the synchronous views and by the Batch API for each line, so a
batch line gets exactly the answer the same request would get on its own.

    endpoint               kind       job input                           answer object
    /v1/embeddings         embedding  {"texts"}                           "list" of "embedding"
    /v1/embed              embedding  the same, from {"texts"}            Cohere v1
    /v2/embed              embedding  the same                            Cohere v2
    /v1/rerank             reranker   {"query", "documents", "top_n"}     Cohere v1 / Jina
    /v2/rerank             reranker   the same                            Cohere v2
    /rerank                reranker   the same, from {"query", "texts"}   TEI: [{index, score}]
    /v1/chat/completions   llm        {"prompt", "max_tokens", "temperature"}  "chat.completion"
    /v1/completions        llm        the same                            "text_completion"
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from inference.intake.lookups import active_service
from inference.jobs.kinds import kind_of
from inference.jobs.vectors import EmbeddingMatrix
from inference.models import Job, Service
from inference.openai_api.chat_template import ChatTemplateError, render_chat
from inference.openai_api.errors import OpenAIError, bad_request, model_not_found
from inference.scheduling.embedding_dims import embedding_dim

EMBEDDINGS = "/v1/embeddings"
EMBED = "/v1/embed"
EMBED_V2 = "/v2/embed"
RERANK = "/v1/rerank"
RERANK_V2 = "/v2/rerank"
TEI_RERANK = "/rerank"
CHAT_COMPLETIONS = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
# OpenAI allows up to 4 stop sequences.
MAX_STOP_SEQUENCES = 4
CHAT_ROLES = {"system", "developer", "user", "assistant"}


@dataclass(frozen=True)
class JobRequest:
    """What one request asks of renq: the service, the job input, and how to answer."""

    service: Service
    payload: dict
    options: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Endpoint:
    path: str
    kind: str
    # body → (job input, answer options); raises OpenAIError naming the request field.
    build: Callable[[dict, Service], tuple[dict, dict]]
    # (finished job, answer options) → the response body (a list for TEI's rerank).
    render: Callable[[Job, dict], dict | list]
    # Job-input field → request field, for errors from inference.jobs.inputs.
    field_names: Mapping[str, str]
    # A request may leave `model` out when one active service of the kind exists (TEI's
    # API serves one model and has no such field).
    model_optional: bool = False


def find_service(model: Any, *, kind: str | None = None) -> Service:
    """The active service named `model`; with `kind`, a missing model names the only active
    service of that kind."""
    if kind is not None and model is None:
        names = list(
            Service.objects.filter(kind=kind, active=True).values_list("name", flat=True)[:11]
        )
        if len(names) == 1:
            return find_service(names[0])
        raise bad_request(
            f"model is required: there are {len(names)} {kind} services"
            + (f" ({', '.join(names[:10])})." if names else "."),
            param="model",
        )
    if not isinstance(model, str) or not model:
        raise bad_request("you must provide a model parameter.", param="model")
    service = active_service(model)
    if service is None:
        raise model_not_found(model)
    return service


def prepare(endpoint: Endpoint, body: Any) -> JobRequest:
    """Check the body and translate it into a job request (one query: the service)."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object.")
    service = find_service(
        body.get("model"), kind=endpoint.kind if endpoint.model_optional else None
    )
    if service.kind != endpoint.kind:
        raise bad_request(
            f"model '{service.name}' is a {service.kind} service; {endpoint.path} needs a "
            f"{endpoint.kind} service.",
            param="model",
            code="model_not_supported",
        )
    payload, options = endpoint.build(body, service)
    return JobRequest(service=service, payload=payload, options=options)


def _usage_tokens(job: Job) -> int:
    if job.input_tokens is not None:
        return job.input_tokens
    return kind_of(job.service.kind).estimate_tokens(job.input)[0]


def _created(job: Job) -> int:
    return int(job.created_at.timestamp())


# --- /v1/embeddings -------------------------------------------------------------------------


def _positive_int(body: dict, name: str) -> int | None:
    value = body.get(name)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise bad_request(f"{name} must be a positive integer.", name)
    return value


def _build_embeddings(body: dict, service: Service) -> tuple[dict, dict]:
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts:
        raise bad_request("input must be a string or a non-empty list of strings.", "input")
    if any(isinstance(item, int | list) for item in texts):
        raise bad_request("token arrays are not supported; send text.", "input")
    encoding_format = body.get("encoding_format") or "float"
    if encoding_format not in ("float", "base64"):
        raise bad_request("encoding_format must be 'float' or 'base64'.", "encoding_format")
    dimensions = _within_model(service, _positive_int(body, "dimensions"), "dimensions")
    return {"texts": texts}, {"encoding_format": encoding_format, "dimensions": dimensions}


def _larger_than_model(param: str, dimensions: int, dim: int) -> OpenAIError:
    return bad_request(f"{param} {dimensions} is larger than the model's {dim}.", param)


def _within_model(service: Service, dimensions: int | None, param: str) -> int | None:
    """Refused before the job runs when a worker noted the model's vector size
    (inference.scheduling.embedding_dims); otherwise when its vectors are sized (_sized)."""
    if dimensions is None:
        return None
    dim = embedding_dim(service.model_ref)
    if dim is not None and dimensions > dim:
        raise _larger_than_model(param, dimensions, dim)
    return dimensions


def _stored_matrix(job: Job) -> EmbeddingMatrix:
    # The stored float32 bytes (inference.jobs.vectors): base64 is encoded from them directly.
    matrix = job.embedding_matrix()
    if matrix is None:
        raise ValueError(f"job {job.pk} has no embeddings")
    return matrix


def _sized(matrix: EmbeddingMatrix, dimensions: int | None, param: str) -> EmbeddingMatrix:
    """The first `dimensions` values of each vector, re-normalised; all of them for None."""
    if dimensions is None:
        return matrix
    if dimensions > matrix.dim:
        raise _larger_than_model(param, dimensions, matrix.dim)
    return matrix.truncated(dimensions)


def _render_embeddings(job: Job, options: dict) -> dict:
    matrix = _sized(_stored_matrix(job), options.get("dimensions"), "dimensions")
    vectors = matrix.encoded(options.get("encoding_format") or "float")
    tokens = _usage_tokens(job)
    return {
        "object": "list",
        "data": [
            {"object": "embedding", "index": i, "embedding": vector}
            for i, vector in enumerate(vectors)
        ],
        "model": job.service.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


# --- embed: Cohere v1 (/v1/embed) and v2 (/v2/embed) ----------------------------------------
# The job /v1/embeddings runs, asked and answered in Cohere's shapes. input_type, max_tokens
# and priority are accepted: the model embeds every text alike and truncates at its own max
# length, and X-Renq-Priority sets the tier.

COHERE_INPUT_TYPES = ("search_document", "search_query", "classification", "clustering")
# Both are the stored float32 vectors. Cohere's int8/uint8/binary/ubinary are its own
# quantisations of its own models: refused, not approximated.
COHERE_EMBEDDING_TYPES = ("float", "base64")
# The model cuts a long text at its own max length, keeping the start: Cohere's END. START
# would keep the end, NONE promises an error instead: both are refused, not approximated.
COHERE_TRUNCATE = "END"


def _embedding_types(value: Any) -> list[str] | None:
    if value is None:
        return None
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise bad_request("embedding_types must be a non-empty list of strings.", "embedding_types")
    refused = [v for v in value if v not in COHERE_EMBEDDING_TYPES]
    if refused:
        raise bad_request(
            f"embedding_types {refused[0]!r} is not supported: renq answers "
            f"{' and '.join(map(repr, COHERE_EMBEDDING_TYPES))}.",
            "embedding_types",
        )
    return list(dict.fromkeys(value))


def _build_embed(body: dict, service: Service) -> tuple[dict, dict]:
    """Cohere v1 and v2: {texts, input_type, embedding_types, truncate, output_dimension}."""
    for name in ("images", "inputs"):
        if body.get(name) is not None:
            raise bad_request(f"{name} are not supported: renq embeds text; send texts.", name)
    texts = body.get("texts")
    if not isinstance(texts, list) or not texts:
        raise bad_request("texts must be a non-empty list of strings.", "texts")
    input_type = body.get("input_type")
    if input_type is not None and input_type not in COHERE_INPUT_TYPES:
        raise bad_request(
            f"input_type must be one of {', '.join(COHERE_INPUT_TYPES)}.", "input_type"
        )
    truncate = body.get("truncate")
    if truncate is not None and truncate != COHERE_TRUNCATE:
        raise bad_request(
            f"truncate must be {COHERE_TRUNCATE}: renq's models cut a long text at its end.",
            "truncate",
        )
    _positive_int(body, "max_tokens")
    return {"texts": texts}, {
        "embedding_types": _embedding_types(body.get("embedding_types")),
        "output_dimension": _within_model(
            service, _positive_int(body, "output_dimension"), "output_dimension"
        ),
    }


def _embed_answer(job: Job, options: dict, version: str, by_type: bool) -> dict:
    """Cohere's EmbedResponse: floats (v1's default) or EmbedByTypeResponse."""
    matrix = _sized(_stored_matrix(job), options.get("output_dimension"), "output_dimension")
    if by_type:
        types = options.get("embedding_types") or ["float"]
        embeddings: Any = {name: matrix.encoded(name) for name in types}
    else:
        embeddings = matrix.encoded("float")
    return {
        "id": f"embed-{job.pk}",
        "embeddings": embeddings,
        "texts": job.input["texts"],
        "meta": {
            "api_version": {"version": version},
            "billed_units": {"input_tokens": _usage_tokens(job)},
        },
        "response_type": "embeddings_by_type" if by_type else "embeddings_floats",
    }


def _render_embed(job: Job, options: dict) -> dict:
    """Cohere v1: `embeddings_floats` unless embedding_types asks for `embeddings_by_type`."""
    return _embed_answer(job, options, "1", by_type=options.get("embedding_types") is not None)


def _render_embed_v2(job: Job, options: dict) -> dict:
    """Cohere v2: always by type, float when embedding_types is left out."""
    return _embed_answer(job, options, "2", by_type=True)


# --- rerank: Cohere v1 and Jina (/v1/rerank), Cohere v2 (/v2/rerank), TEI (/rerank) ----------
# One job input for all three; only the request's field names and the answer's shape differ.
# `relevance_score`/`score` is the score the backend gave: the local cross-encoder's logit,
# or the cloud API's own score; higher is more relevant either way.

# Cohere bills a query with up to 100 documents as one search unit.
DOCUMENTS_PER_SEARCH_UNIT = 100


def _optional_bool(body: dict, name: str, default: bool = False) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false.", name)
    return value


def _rerank_documents(documents: Any, param: str) -> list[str]:
    if not isinstance(documents, list) or not documents:
        raise bad_request(f"{param} must be a non-empty list.", param)
    texts = []
    for i, document in enumerate(documents):
        if isinstance(document, dict):  # Cohere v1's {"text": ...}
            document = document.get("text")
        if not isinstance(document, str):
            raise bad_request('must be a string or {"text": string}.', f"{param}[{i}]")
        texts.append(document)
    return texts


def _rerank_payload(query: Any, documents: list[str], top_n: Any) -> dict:
    payload: dict[str, Any] = {"query": query, "documents": documents}
    if top_n is not None:
        payload["top_n"] = top_n
    return payload


def _build_rerank(body: dict, service: Service) -> tuple[dict, dict]:
    """Cohere v1/v2 and Jina: {query, documents, top_n, return_documents}. Cohere's
    max_tokens_per_doc and priority are accepted; the model truncates each document at its
    own max length, and X-Renq-Priority sets the tier."""
    max_tokens_per_doc = body.get("max_tokens_per_doc")
    if max_tokens_per_doc is not None and (
        isinstance(max_tokens_per_doc, bool)
        or not isinstance(max_tokens_per_doc, int)
        or max_tokens_per_doc < 1
    ):
        raise bad_request("max_tokens_per_doc must be a positive integer.", "max_tokens_per_doc")
    payload = _rerank_payload(
        body.get("query"), _rerank_documents(body.get("documents"), "documents"), body.get("top_n")
    )
    return payload, {"return_documents": _optional_bool(body, "return_documents")}


def _build_tei_rerank(body: dict, service: Service) -> tuple[dict, dict]:
    """TEI: {query, texts, return_text, raw_scores, truncate, truncation_direction}; the model
    always truncates (at its max length), and scores are returned as the backend gave them."""
    for name in ("raw_scores", "truncate"):
        _optional_bool(body, name)
    direction = body.get("truncation_direction")
    if direction is not None and direction not in ("Right", "Left", "right", "left"):
        raise bad_request("truncation_direction must be Right or Left.", "truncation_direction")
    payload = _rerank_payload(
        body.get("query"), _rerank_documents(body.get("texts"), "texts"), body.get("top_n")
    )
    return payload, {"return_text": _optional_bool(body, "return_text")}


def _ranked(job: Job) -> list[tuple[int, float]]:
    scores = job.result["scores"]
    return [(index, scores[index]) for index in job.result["ranking"]]


def _rerank_meta(job: Job, version: str) -> dict:
    """Cohere's `meta`: the API version answered and what the request was billed."""
    tokens = _usage_tokens(job)
    search_units = math.ceil(len(job.input["documents"]) / DOCUMENTS_PER_SEARCH_UNIT)
    return {
        "api_version": {"version": version},
        "billed_units": {"search_units": search_units},
        "tokens": {"input_tokens": tokens, "output_tokens": 0},
    }


def _rerank_results(job: Job, options: dict) -> list[dict]:
    documents = job.input["documents"]
    results = []
    for index, score in _ranked(job):
        item: dict[str, Any] = {"index": index, "relevance_score": score}
        if options.get("return_documents"):
            item["document"] = {"text": documents[index]}
        results.append(item)
    return results


def _render_rerank(job: Job, options: dict) -> dict:
    """Cohere v1's RerankResponse, plus Jina's `model` and `usage`."""
    return {
        "id": f"rerank-{job.pk}",
        "model": job.service.name,
        "results": _rerank_results(job, options),
        "usage": {"total_tokens": _usage_tokens(job)},
        "meta": _rerank_meta(job, "1"),
    }


def _render_rerank_v2(job: Job, options: dict) -> dict:
    """Cohere v2's V2RerankResponse: {id, results: [{index, relevance_score}], meta}."""
    return {
        "id": f"rerank-{job.pk}",
        "results": _rerank_results(job, options),
        "meta": _rerank_meta(job, "2"),
    }


def _render_tei_rerank(job: Job, options: dict) -> list[dict]:
    """TEI's answer: a list of {index, score} (and `text` with return_text), best first."""
    documents = job.input["documents"]
    answer = []
    for index, score in _ranked(job):
        item: dict[str, Any] = {"index": index, "score": score}
        if options.get("return_text"):
            item["text"] = documents[index]
        answer.append(item)
    return answer


# --- /v1/chat/completions and /v1/completions ----------------------------------------------


def _generation_options(body: dict, payload: dict) -> dict:
    """max_tokens, temperature, n and stop, shared by both completion endpoints."""
    n = body.get("n")
    if n is not None and n != 1:
        raise bad_request("only n=1 is supported.", "n")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None:
        payload["max_tokens"] = max_tokens
    if body.get("temperature") is not None:
        payload["temperature"] = body["temperature"]
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and (
        not isinstance(stop, list)
        or len(stop) > MAX_STOP_SEQUENCES
        or not all(isinstance(s, str) and s for s in stop)
    ):
        raise bad_request(
            f"stop must be a string or a list of up to {MAX_STOP_SEQUENCES} strings.", "stop"
        )
    return {"stop": stop or []}


def apply_stop(text: str, finish_reason: str, stop: list[str]) -> tuple[str, str]:
    """Cut the text at the first stop sequence (excluded, as OpenAI does)."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    if not cuts:
        return text, finish_reason
    return text[: min(cuts)], "stop"


def _message_text(message: Any, index: int) -> tuple[str, str]:
    if not isinstance(message, dict):
        raise bad_request("each message must be an object.", f"messages[{index}]")
    role = message.get("role")
    if role not in CHAT_ROLES:
        raise bad_request(
            f"role must be one of {', '.join(sorted(CHAT_ROLES))}.", f"messages[{index}].role"
        )
    content = message.get("content")
    if isinstance(content, list):  # content parts: text only
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                raise bad_request(
                    "only text content parts are supported.", f"messages[{index}].content"
                )
            parts.append(str(part.get("text", "")))
        content = "".join(parts)
    if not isinstance(content, str):
        raise bad_request("content must be a string.", f"messages[{index}].content")
    return ("system" if role == "developer" else role), content


def _build_chat(body: dict, service: Service) -> tuple[dict, dict]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list.", "messages")
    turns = [_message_text(message, i) for i, message in enumerate(messages)]
    try:
        prompt = render_chat(
            service.model_ref, [{"role": role, "content": text} for role, text in turns]
        )
    except ChatTemplateError as exc:
        raise bad_request(
            f"the model's chat template refused the messages: {exc}", "messages"
        ) from exc
    payload: dict[str, Any] = {"prompt": prompt}
    return payload, _generation_options(body, payload)


def _build_completion(body: dict, service: Service) -> tuple[dict, dict]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if isinstance(prompt, list):
        raise bad_request(
            "one prompt per request (send several as a batch: /v1/batches).", "prompt"
        )
    if not isinstance(prompt, str):
        raise bad_request("prompt must be a string; token arrays are not supported.", "prompt")
    payload: dict[str, Any] = {"prompt": prompt}
    return payload, _generation_options(body, payload)


def completion_usage(job: Job) -> dict:
    usage = job.result.get("usage") or {}
    prompt_tokens = int(usage.get("prompt_tokens", 0))
    completion_tokens = int(usage.get("completion_tokens", 0))
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _render_chat(job: Job, options: dict) -> dict:
    text, finish_reason = apply_stop(
        job.result["text"], job.result.get("finish_reason", "stop"), options.get("stop", [])
    )
    return {
        "id": f"chatcmpl-{job.pk}",
        "object": "chat.completion",
        "created": _created(job),
        "model": job.service.name,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish_reason,
            }
        ],
        "usage": completion_usage(job),
    }


def _render_completion(job: Job, options: dict) -> dict:
    text, finish_reason = apply_stop(
        job.result["text"], job.result.get("finish_reason", "stop"), options.get("stop", [])
    )
    return {
        "id": f"cmpl-{job.pk}",
        "object": "text_completion",
        "created": _created(job),
        "model": job.service.name,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
        "usage": completion_usage(job),
    }


_EMBED_FIELDS = {"input.texts": "texts"}
_RERANK_FIELDS = {"input.query": "query", "input.documents": "documents", "input.top_n": "top_n"}
_GENERATION_FIELDS = {
    "input.max_tokens": "max_tokens",
    "input.temperature": "temperature",
}

ENDPOINTS: dict[str, Endpoint] = {
    EMBEDDINGS: Endpoint(
        EMBEDDINGS, "embedding", _build_embeddings, _render_embeddings, {"input.texts": "input"}
    ),
    EMBED: Endpoint(EMBED, "embedding", _build_embed, _render_embed, _EMBED_FIELDS),
    EMBED_V2: Endpoint(EMBED_V2, "embedding", _build_embed, _render_embed_v2, _EMBED_FIELDS),
    RERANK: Endpoint(RERANK, "reranker", _build_rerank, _render_rerank, _RERANK_FIELDS),
    RERANK_V2: Endpoint(RERANK_V2, "reranker", _build_rerank, _render_rerank_v2, _RERANK_FIELDS),
    TEI_RERANK: Endpoint(
        TEI_RERANK,
        "reranker",
        _build_tei_rerank,
        _render_tei_rerank,
        {**_RERANK_FIELDS, "input.documents": "texts"},
        model_optional=True,
    ),
    CHAT_COMPLETIONS: Endpoint(
        CHAT_COMPLETIONS,
        "llm",
        _build_chat,
        _render_chat,
        {"input.prompt": "messages", **_GENERATION_FIELDS},
    ),
    COMPLETIONS: Endpoint(
        COMPLETIONS,
        "llm",
        _build_completion,
        _render_completion,
        {"input.prompt": "prompt", **_GENERATION_FIELDS},
    ),
}


def job_failure(job: Job) -> OpenAIError:
    """The error answer for a job that ended without a result."""
    if job.status == "expired":
        return OpenAIError(
            503,
            f"job {job.pk} expired before a worker could run it: {job.error}",
            type="server_error",
            code="job_expired",
            headers={"Retry-After": "1"},
        )
    if job.status == "cancelled":
        return OpenAIError(409, f"job {job.pk} was cancelled.", code="job_cancelled")
    return OpenAIError(
        500, f"job {job.pk} failed: {job.error}", type="server_error", code="job_failed"
    )
