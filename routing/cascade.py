"""The fallback cascade: after a failed attempt, the next backend or the end of the road.

Each backend tries a job at most once (litellm#19985: fallbacks that reset the retry cycle call
models again and again), so a cascade always ends. An error that retrying cannot fix (the
upstream said the input is bad: 400/413/422) ends it at once. A job fails only when no untried,
healthy backend is left, and the failure then lists every attempt's reason.

This module decides; the job lifecycle (inference.dispatch.placement) carries the decision out: it
records the attempt first, asks `FallbackCascade.next_step`, and either hands the job to the
chosen backend or fails it with `step.failure`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from routing.attempts import attempt_reasons, tried_backend_ids
from routing.backends.base import BackendError
from routing.models import Backend
from routing.request import RoutingRequest
from routing.router import Router, RoutingDecision


@dataclass(frozen=True)
class CascadeStep:
    """Exactly one of the two is set."""

    next: RoutingDecision | None = None
    failure: str | None = None


def failure_message(reasons: Sequence[str], *, final: bool = False) -> str:
    head = (
        "the upstream rejected the input (not retryable)"
        if final
        else f"every backend failed ({len(reasons)})"
    )
    return f"{head}: " + "; ".join(reasons)


class FallbackCascade:
    def __init__(self, router: Router | None = None):
        self.router = router or Router()

    def next_step(
        self, job_id: object, request: RoutingRequest, failed: Backend, error: BackendError
    ) -> CascadeStep:
        """Call after the failed attempt is recorded."""
        if not error.retryable:
            return CascadeStep(failure=failure_message(attempt_reasons(job_id), final=True))
        decision, skipped = self.router.fallback_after(request, failed, tried_backend_ids(job_id))
        if decision is None:
            return CascadeStep(failure=failure_message(attempt_reasons(job_id) + skipped))
        return CascadeStep(next=decision)
