"""One attempt of one job on a cloud backend, as an I/O worker runs it.

claim (Postgres, so a duplicate message never calls a paid API twice) → reserve rate limits
(Redis, atomic across workers) → breaker → HTTP call → learn from the response headers →
store the result, or record the failure and continue the cascade.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.utils import timezone

from inference.admission import shared_redis
from inference.batch_runner import worker_identity
from inference.claims import Outcome, claim_jobs, store_outcomes
from inference.models import Job
from routing.backends import adapter_for
from routing.backends.base import AdapterResult, BackendError, BackendSkipped
from routing.breaker import CircuitBreaker
from routing.cascade import continue_cascade, record_attempt
from routing.limits import RateLimitTracker
from routing.models import AttemptOutcome, Backend
from routing.router import estimate_tokens
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

    def call(self, backend: Backend, job: Job) -> AdapterResult:
        tokens = sum(estimate_tokens(job.service.kind, job.input))
        reservation = self.limits.reserve(backend, tokens)
        if not reservation:
            raise BackendSkipped(f"{backend.name}: skipped ({reservation.reason} limit)")
        state = self.breaker.acquire(backend)
        if not state.allowed:
            self.limits.release(reservation)
            raise BackendSkipped(f"{backend.name}: skipped (circuit breaker {state.state})")
        try:
            result = adapter_for(backend).call(job.input, job.service.kind)
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


def run_cloud_attempt(job_id: str, backend_id: int, *, redelivered: bool = False) -> dict:
    worker = worker_identity()
    claim = claim_jobs([job_id], redelivered_ids=[job_id] if redelivered else [], worker=worker)
    if not claim.jobs:
        return {"claimed": False, "expired": len(claim.expired)}
    job = claim.jobs[0]
    backend = Backend.objects.get(pk=backend_id)
    started_at = timezone.now()
    try:
        result = GuardedCaller.shared().call(backend, job)
    except BackendError as exc:
        record_attempt(
            job,
            backend,
            started_at=started_at,
            outcome=exc.outcome,
            error=exc.message,
            status_code=exc.status_code,
            worker=worker,
        )
        error = continue_cascade(job, claim.token, backend, exc)
        if error is not None:
            store_outcomes(claim.token, [Outcome(job=job, error=error, started_at=started_at)])
        return {"claimed": True, "backend": backend.name, "outcome": exc.outcome}
    record_attempt(
        job,
        backend,
        started_at=started_at,
        outcome=AttemptOutcome.SUCCEEDED,
        status_code=result.status_code,
        input_tokens=result.input_tokens,
        output_tokens=result.output_tokens,
        worker=worker,
    )
    # After the attempt row, so whoever sees the job succeeded also sees how.
    store_outcomes(
        claim.token,
        [
            Outcome(
                job=job,
                result=result.result,
                started_at=started_at,
                inference_ms=result.latency_s * 1000,
                batch_size=1,
                tokens=result.input_tokens,
            )
        ],
    )
    return {"claimed": True, "backend": backend.name, "outcome": "succeeded"}
