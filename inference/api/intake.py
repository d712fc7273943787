"""Reading a submission's body: one job (an object) or many (a list of objects), with every
unknown field refused by name (a typo such as "priorty" must not silently run a job at the
default tier)."""

from __future__ import annotations

from typing import Any

from inference.jobs.inputs import InputError

JOB_FIELDS = frozenset({"service", "input", "priority", "deadline_ms"})


def _prefixed(exc: InputError, prefix: str) -> InputError:
    return InputError(f"{prefix}{exc.field}", exc.message) if prefix else exc


def job_fields(body: Any, *, prefix: str = "") -> dict:
    """The fields of one job object; InputError names the offending field (with `prefix`,
    e.g. "[3]." for the fourth job of a list)."""
    if not isinstance(body, dict):
        raise InputError(prefix.rstrip(".") or "body", "must be a JSON object.")
    unknown = sorted(set(body) - JOB_FIELDS)
    if unknown:
        raise InputError(
            f"{prefix}{unknown[0]}",
            f"is not a known field (known: {', '.join(sorted(JOB_FIELDS))}).",
        )
    if "input" not in body or body["input"] is None:
        raise InputError(f"{prefix}input", "is required.")
    return body


def requested_actor(request) -> str:
    """Who submitted, for the audit trail: the API key's prefix (never the key)."""
    key = getattr(request, "auth", None)
    prefix = getattr(key, "prefix", "")
    return f"api:{prefix}" if prefix else "api"
