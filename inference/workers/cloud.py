"""One attempt of one job on a cloud backend, as an I/O worker runs it.

claim (Postgres, so a duplicate message never calls a paid API twice) → a guarded call
(shared rate limits, breaker) → settle the attempt (inference.dispatch.settlement): store the
result, or record the failure and continue the cascade.
"""

from __future__ import annotations

import logging

from django.utils import timezone

from inference.dispatch.settlement import Attempt, settle_attempts
from inference.jobs.kinds import kind_of
from inference.jobs.transitions import Outcome
from inference.metrics.log_fields import job_fields
from inference.models import Job
from inference.workers import worker_identity
from inference.workers.leases import lease_keeper
from routing.backends.base import BackendError
from routing.calls import GuardedCaller
from routing.models import Backend

logger = logging.getLogger(__name__)


def run_cloud_attempt(job_id: str, backend_id: int, *, redelivered: bool = False) -> dict:
    with lease_keeper.holding():
        return _attempt(job_id, backend_id, redelivered=redelivered)


def _attempt(job_id: str, backend_id: int, *, redelivered: bool) -> dict:
    worker = worker_identity()
    claim = Job.objects.claim(
        [job_id], redelivered_ids=[job_id] if redelivered else [], worker=worker
    )
    if not claim.jobs:
        return {"claimed": False, "expired": len(claim.expired)}
    job = claim.jobs[0]
    backend = Backend.objects.get(pk=backend_id)
    started_at = timezone.now()
    kind = job.service.kind
    try:
        result = GuardedCaller.shared().call(
            backend,
            job.input,
            service_kind=kind,
            tokens=sum(kind_of(kind).estimate_tokens(job.input)),
        )
    except BackendError as exc:
        logger.info("attempt failed: %s", exc.message, extra=job_fields(job, backend=backend.name))
        attempt = Attempt(
            Outcome(job=job, error=exc.message, started_at=started_at),
            backend=backend,
            failure=exc,
            status_code=exc.status_code,
            worker=worker,
        )
    else:
        attempt = Attempt(
            Outcome(
                job=job,
                result=result.result,
                started_at=started_at,
                inference_ms=result.latency_s * 1000,
                batch_size=1,
                tokens=result.input_tokens,
            ),
            backend=backend,
            status_code=result.status_code,
            output_tokens=result.output_tokens,
            worker=worker,
        )
    settle_attempts(claim.token, [attempt])
    outcome = "succeeded" if attempt.failure is None else attempt.failure.outcome
    return {"claimed": True, "backend": backend.name, "outcome": outcome}
