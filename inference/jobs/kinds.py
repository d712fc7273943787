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
from typing import Any, Protocol

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
    # (input, output) tokens estimated from characters.
    estimate_tokens: Callable[[dict], tuple[int, int]]
    # One job per bulk item instead of one full batch per piece (a job is one prompt).
    one_item_per_piece: bool = False

    def engine_class(self) -> type:
        """The kind's engine class (an inference.engines Engine), imported on first use."""
        module_name, _, class_name = self.engine_path.rpartition(".")
        return getattr(importlib.import_module(module_name), class_name)

    def engine_payload(self, service: ServiceSettings, payload: dict) -> dict:
        """The job's input plus the service-level defaults the engine needs."""
        if self.name == "embedding" and "normalize" not in payload:
            return {**payload, "normalize": service.normalize_embeddings}
        return payload


def _chars(*texts: str) -> int:
    return sum(len(t) for t in texts)


def _estimate_embedding(payload: dict) -> tuple[int, int]:
    return max(1, _chars(*payload.get("texts", [])) // CHARS_PER_TOKEN), 0


def _estimate_rerank(payload: dict) -> tuple[int, int]:
    query = payload.get("query", "")
    chars = sum(len(query) + len(d) for d in payload.get("documents", []))
    return max(1, chars // CHARS_PER_TOKEN), 0


def _estimate_llm(payload: dict) -> tuple[int, int]:
    prompt_tokens = max(1, len(payload.get("prompt", "")) // CHARS_PER_TOKEN)
    return prompt_tokens, int(payload.get("max_tokens", DEFAULT_MAX_TOKENS))


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
