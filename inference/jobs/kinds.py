"""The registry of service kinds: everything renq knows about embedding, reranker and LLM
services, in one place.

A kind says how its input is validated, which engine runs it (imported on first use, so the
web and I/O processes never import torch), what the warm-up pass sends, how a bulk job splits
into pieces and merges back, how many tokens a job is estimated to cost before a tokenizer has
seen it, and what the engine needs from the service's settings. Adding a kind is adding one
`ServiceKindSpec` here.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

from inference.jobs.inputs import (
    DEFAULT_MAX_TOKENS,
    validate_embedding,
    validate_llm,
    validate_noop,
    validate_reranker,
)
from inference.jobs.vectors import EmbeddingMatrix


class ServiceSettings(Protocol):
    """What a kind reads of its service (an inference.models.Service row)."""

    normalize_embeddings: bool

# Rough tokens per character for estimates before a tokenizer has seen the input (rate
# limits, costs, context-length checks).
CHARS_PER_TOKEN = 4


class TokenEstimate(NamedTuple):
    """A job's tokens, estimated from characters before a tokenizer has seen them. Every
    sequence the model reads counts up to the model's max length where it truncates (an
    encoder reads no more of a long text)."""

    input_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class ServiceKindSpec:
    name: str
    # validate(payload, max_items=…, field=…) → the clean payload, or InputError naming the field.
    validate: Callable[..., dict]
    engine_path: str
    warmup_payload: dict
    # Bulk jobs: the list that is split, how a piece's input is built, how results merge.
    bulk_items_field: str
    bulk_piece: Callable[[dict, list], dict]
    bulk_merge: Callable[[dict, list[dict]], dict]
    # estimate_tokens(payload, max_sequence_tokens=None) → TokenEstimate; the limit is the
    # model's max length, for the kinds whose engine truncates each sequence to it.
    estimate_tokens: Callable[..., TokenEstimate]
    # The longest single sequence one model call reads, as sent (an embedding text, the
    # query with one document, a prompt with its completion): what a context must hold.
    longest_sequence_tokens: Callable[[dict], int]
    # One job per bulk item instead of one full batch per piece (a job is one prompt).
    one_item_per_piece: bool = False
    # The engine truncates each sequence at the model's max length (encoders do).
    truncates_to_model_length: bool = False
    # A job run again gives the result it gave (no sampling): a result stored for it may be
    # undone by a database crash and computed again (JobQuerySet.store_outcomes).
    reproducible: bool = False

    def engine_class(self) -> type:
        """The kind's engine class (an inference.engines Engine), imported on first use."""
        module_name, _, class_name = self.engine_path.rpartition(".")
        return getattr(importlib.import_module(module_name), class_name)

    def engine_payload(self, service: ServiceSettings, payload: dict) -> dict:
        """The job's input plus the service-level defaults the engine needs."""
        if self.name == "embedding" and "normalize" not in payload:
            return {**payload, "normalize": service.normalize_embeddings}
        return payload


def _tokens_read(lengths: list[int], max_sequence_tokens: int | None) -> int:
    """Tokens of sequences of these character lengths, each counted up to the limit."""
    if max_sequence_tokens is not None:
        lengths = [min(n, max_sequence_tokens * CHARS_PER_TOKEN) for n in lengths]
    return max(1, sum(lengths) // CHARS_PER_TOKEN)


def _embedding_lengths(payload: dict) -> list[int]:
    return [len(text) for text in payload.get("texts", [])]


def _rerank_lengths(payload: dict) -> list[int]:
    # A cross-encoder reads the query with each document as one sequence.
    query = len(payload.get("query", ""))
    return [query + len(document) for document in payload.get("documents", [])]


def _estimate_embedding(payload: dict, max_sequence_tokens: int | None = None) -> TokenEstimate:
    return TokenEstimate(_tokens_read(_embedding_lengths(payload), max_sequence_tokens), 0)


def _estimate_rerank(payload: dict, max_sequence_tokens: int | None = None) -> TokenEstimate:
    return TokenEstimate(_tokens_read(_rerank_lengths(payload), max_sequence_tokens), 0)


def _estimate_llm(payload: dict, max_sequence_tokens: int | None = None) -> TokenEstimate:
    prompt_tokens = max(1, len(payload.get("prompt", "")) // CHARS_PER_TOKEN)
    return TokenEstimate(prompt_tokens, int(payload.get("max_tokens", DEFAULT_MAX_TOKENS)))


def _longest_embedding(payload: dict) -> int:
    return max(_embedding_lengths(payload), default=0) // CHARS_PER_TOKEN


def _longest_rerank(payload: dict) -> int:
    return max(_rerank_lengths(payload), default=0) // CHARS_PER_TOKEN


def _longest_llm(payload: dict) -> int:
    return sum(_estimate_llm(payload))


def _merge_embeddings(bulk_input: dict, results: list[dict]) -> dict:
    dim = results[0]["dim"] if results else 0
    vectors = EmbeddingMatrix.concat([r["embeddings"] for r in results], dim)
    return {"embeddings": vectors, "dim": dim}


def _merge_rerank(bulk_input: dict, results: list[dict]) -> dict:
    scores = [s for r in results for s in r["scores"]]
    ranking = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    if bulk_input.get("top_n"):
        ranking = ranking[: bulk_input["top_n"]]
    return {"scores": scores, "ranking": ranking}


def _merge_completions(bulk_input: dict, results: list[dict]) -> dict:
    return {"completions": results}


def _texts_piece(bulk: dict, chunk: list) -> dict:
    """A piece of a bulk over texts: the bulk's options, with its share of the texts."""
    return {k: v for k, v in bulk.items() if k != "texts"} | {"texts": chunk}


def _llm_piece(bulk: dict, chunk: list) -> dict:
    piece = {"prompt": chunk[0]}
    for name in ("max_tokens", "temperature"):
        if name in bulk:
            piece[name] = bulk[name]
    return piece


KINDS: dict[str, ServiceKindSpec] = {
    "embedding": ServiceKindSpec(
        name="embedding",
        validate=validate_embedding,
        engine_path="inference.engines.embedding.EmbeddingEngine",
        warmup_payload={"texts": ["warm up"]},
        bulk_items_field="texts",
        bulk_piece=_texts_piece,
        bulk_merge=_merge_embeddings,
        estimate_tokens=_estimate_embedding,
        longest_sequence_tokens=_longest_embedding,
        truncates_to_model_length=True,
        reproducible=True,
    ),
    "reranker": ServiceKindSpec(
        name="reranker",
        validate=validate_reranker,
        engine_path="inference.engines.reranker.RerankerEngine",
        warmup_payload={"query": "warm", "documents": ["up"]},
        bulk_items_field="documents",
        bulk_piece=lambda bulk, chunk: {"query": bulk["query"], "documents": chunk},
        bulk_merge=_merge_rerank,
        estimate_tokens=_estimate_rerank,
        longest_sequence_tokens=_longest_rerank,
        truncates_to_model_length=True,
        reproducible=True,
    ),
    "llm": ServiceKindSpec(
        name="llm",
        validate=validate_llm,
        engine_path="inference.engines.llm.LlmEngine",
        warmup_payload={"prompt": "warm up", "max_tokens": 1, "temperature": 0.0},
        bulk_items_field="prompts",
        bulk_piece=_llm_piece,
        bulk_merge=_merge_completions,
        estimate_tokens=_estimate_llm,
        longest_sequence_tokens=_longest_llm,
        one_item_per_piece=True,
    ),
    # Benchmarks and tests only: the stack's own cost, no model (inference.engines.noop).
    "noop": ServiceKindSpec(
        name="noop",
        validate=validate_noop,
        engine_path="inference.engines.noop.NoopEngine",
        warmup_payload={"texts": ["warm up"]},
        bulk_items_field="texts",
        bulk_piece=_texts_piece,
        bulk_merge=lambda bulk_input, results: {"count": sum(r["count"] for r in results)},
        estimate_tokens=_estimate_embedding,
        longest_sequence_tokens=_longest_embedding,
        reproducible=True,
    ),
}


def kind_of(name: str) -> ServiceKindSpec:
    try:
        return KINDS[name]
    except KeyError:
        known = ", ".join(sorted(KINDS))
        raise ValueError(f"Unknown service kind {name!r}; expected one of: {known}.") from None


def validate_input(kind: str, payload: Any, *, max_items: int, field: str = "input") -> dict:
    return kind_of(kind).validate(payload, max_items=max_items, field=field)
