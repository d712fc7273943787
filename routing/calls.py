"""One call to a backend's API within its shared rate limits and circuit breaker.

reserve rpm/tpm (Redis, atomic across workers) → breaker → adapter call → learn from the
response headers → reconcile the reservation with the real usage.
"""

from __future__ import annotations

from dataclasses import dataclass

from renq_site.shared_redis import shared_redis
from routing.backends.base import AdapterResult, BackendError, BackendSkipped
from routing.breaker import CircuitBreaker
from routing.limits import RateLimitTracker
from routing.models import Backend
from routing.stats import record_latency


@dataclass
class GuardedCaller:
    """Calls a backend only within its limits and breaker, and learns from every answer."""

    limits: RateLimitTracker
    breaker: CircuitBreaker

    @classmethod
    def shared(cls) -> GuardedCaller:
        client = shared_redis()
        return cls(RateLimitTracker(client), CircuitBreaker(client))

    def call(
        self, backend: Backend, payload: dict, *, service_kind: str, tokens: int
    ) -> AdapterResult:
        reservation = self.limits.reserve(backend, tokens)
        if not reservation:
            raise BackendSkipped(f"{backend.name}: skipped ({reservation.reason} limit)")
        state = self.breaker.acquire(backend)
        if not state.allowed:
            self.limits.release(reservation)
            raise BackendSkipped(f"{backend.name}: skipped (circuit breaker {state.state})")
        try:
            result = backend.adapter().call(payload, service_kind)
        except BackendError as exc:
            self.limits.observe(backend.pk, exc.headers, exc.status_code or 0)
            if exc.breaker_failure:
                self.breaker.record_failure(backend)
            raise
        self.limits.observe(backend.pk, result.headers, result.status_code)
        self.limits.reconcile(reservation, result.input_tokens + result.output_tokens)
        self.breaker.record_success(backend)
        record_latency(backend.pk, result.latency_s)
        return result
