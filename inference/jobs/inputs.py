"""Validation of job inputs per service kind, with errors that name the offending field.

Plain Python so the REST API, the bulk splitter and management commands share one definition.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_TEXT_CHARS = 20_000
MAX_PROMPT_CHARS = 50_000
MAX_GENERATION_TOKENS = 2048
# What an LLM job gets when it names neither; the engines and adapters read the validated
# payload, so these are written here only.
DEFAULT_MAX_TOKENS = 64
DEFAULT_TEMPERATURE = 0.0


class InputError(ValueError):
    """Bad job input. `field` is the dotted path of the offending field, e.g. `input.texts[2]`."""

    def __init__(self, field: str, message: str):
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class UnservableJob(InputError):
    """No configured backend can serve the job: too large for each, or each misconfigured
    (e.g. its API key variable unset). Refused at submission, naming every backend's reason,
    instead of accepted and failed later. `code` says which kind of refusal it is."""

    def __init__(self, reasons: Sequence[str], *, too_large: bool):
        self.reasons = list(reasons)
        self.code = "context_length_exceeded" if too_large else "no_backend_available"
        super().__init__("input", "no configured backend can serve this job: " + "; ".join(reasons))


def check_storable_text(value: str, field: str) -> None:
    """PostgreSQL's jsonb stores neither NUL nor lone UTF-16 surrogates: refuse them here,
    naming the item, instead of failing the INSERT with a 500."""
    if "\x00" in value:
        raise InputError(field, "contains a NUL character (\\u0000), which cannot be stored.")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(
            field, "contains a lone surrogate (e.g. \\ud800): not valid Unicode text."
        ) from None


def _require_dict(value: Any, field: str) -> dict:
    if not isinstance(value, dict):
        raise InputError(field, "must be a JSON object.")
    return value


def _string_list(value: Any, field: str, *, max_items: int, max_chars: int) -> list[str]:
    if value is None:
        raise InputError(field, "is required.")
    if not isinstance(value, list):
        raise InputError(field, "must be a list of strings.")
    if not value:
        raise InputError(field, "must not be empty.")
    if len(value) > max_items:
        raise InputError(field, f"has {len(value)} items; at most {max_items} are allowed.")
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise InputError(f"{field}[{i}]", "must be a non-empty string.")
        if len(item) > max_chars:
            raise InputError(f"{field}[{i}]", f"is longer than {max_chars} characters.")
        check_storable_text(item, f"{field}[{i}]")
    return value


def _reject_unknown(payload: dict, allowed: set[str], field: str) -> None:
    unknown = sorted(set(payload) - allowed)
    if unknown:
        raise InputError(f"{field}.{unknown[0]}", "is not a known field.")


def validate_embedding(payload: Any, *, max_items: int, field: str = "input") -> dict:
    payload = _require_dict(payload, field)
    _reject_unknown(payload, {"texts", "normalize"}, field)
    texts = _string_list(
        payload.get("texts"), f"{field}.texts", max_items=max_items, max_chars=MAX_TEXT_CHARS
    )
    clean: dict[str, Any] = {"texts": texts}
    if "normalize" in payload:
        if not isinstance(payload["normalize"], bool):
            raise InputError(f"{field}.normalize", "must be true or false.")
        clean["normalize"] = payload["normalize"]
    return clean


def validate_reranker(payload: Any, *, max_items: int, field: str = "input") -> dict:
    payload = _require_dict(payload, field)
    _reject_unknown(payload, {"query", "documents", "top_n"}, field)
    query = payload.get("query")
    if not isinstance(query, str) or not query.strip():
        raise InputError(f"{field}.query", "must be a non-empty string.")
    if len(query) > MAX_TEXT_CHARS:
        raise InputError(f"{field}.query", f"is longer than {MAX_TEXT_CHARS} characters.")
    check_storable_text(query, f"{field}.query")
    documents = _string_list(
        payload.get("documents"),
        f"{field}.documents",
        max_items=max_items,
        max_chars=MAX_TEXT_CHARS,
    )
    clean: dict[str, Any] = {"query": query, "documents": documents}
    top_n = payload.get("top_n")
    if top_n is not None:
        if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
            raise InputError(f"{field}.top_n", "must be a positive integer.")
        clean["top_n"] = top_n
    return clean


def validate_llm(payload: Any, *, max_items: int, field: str = "input") -> dict:
    payload = _require_dict(payload, field)
    _reject_unknown(payload, {"prompt", "max_tokens", "temperature", "stream"}, field)
    prompt = payload.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise InputError(f"{field}.prompt", "must be a non-empty string.")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InputError(f"{field}.prompt", f"is longer than {MAX_PROMPT_CHARS} characters.")
    check_storable_text(prompt, f"{field}.prompt")
    max_tokens = payload.get("max_tokens", DEFAULT_MAX_TOKENS)
    if (
        isinstance(max_tokens, bool)
        or not isinstance(max_tokens, int)
        or not 1 <= max_tokens <= MAX_GENERATION_TOKENS
    ):
        raise InputError(
            f"{field}.max_tokens", f"must be an integer from 1 to {MAX_GENERATION_TOKENS}."
        )
    temperature = payload.get("temperature", DEFAULT_TEMPERATURE)
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise InputError(f"{field}.temperature", "must be a number from 0 to 2.")
    if not 0.0 <= float(temperature) <= 2.0:
        raise InputError(f"{field}.temperature", "must be a number from 0 to 2.")
    clean = {"prompt": prompt, "max_tokens": max_tokens, "temperature": float(temperature)}
    stream = payload.get("stream", False)
    if not isinstance(stream, bool):
        raise InputError(f"{field}.stream", "must be true or false.")
    if stream:
        # The worker publishes the text as it is generated (inference.delivery.streaming).
        clean["stream"] = True
    return clean


MAX_NOOP_SLEEP_MS = 60_000


def validate_noop(payload: Any, *, max_items: int, field: str = "input") -> dict:
    payload = _require_dict(payload, field)
    _reject_unknown(payload, {"texts", "sleep_ms"}, field)
    texts = _string_list(
        payload.get("texts"), f"{field}.texts", max_items=max_items, max_chars=MAX_TEXT_CHARS
    )
    clean: dict[str, Any] = {"texts": texts}
    sleep_ms = payload.get("sleep_ms", 0)
    if (
        isinstance(sleep_ms, bool)
        or not isinstance(sleep_ms, int | float)
        or not 0 <= sleep_ms <= MAX_NOOP_SLEEP_MS
    ):
        raise InputError(f"{field}.sleep_ms", f"must be a number from 0 to {MAX_NOOP_SLEEP_MS}.")
    if sleep_ms:
        clean["sleep_ms"] = sleep_ms
    return clean
