"""One attempt of one job on a cloud backend, as an I/O worker runs it.

claim (Postgres, so a duplicate message never calls a paid API twice) → a guarded call
(shared rate limits, breaker) → store the result, or record the failure and continue the
cascade.
"""

from __future__ import annotations

import logging

from django.utils import timezone

from inference.dispatch.placement import hand_on
from inference.jobs.kinds import kind_of
from inference.jobs.transitions import Outcome
from inference.metrics.log_fields import job_fields
from inference.models import Job
from inference.workers import worker_identity
from routing.attempts import AttemptOutcome, AttemptRecord, record_attempt
from routing.backends.base import BackendError
from routing.calls import GuardedCaller
from routing.models import Backend

logger = logging.getLogger(__name__)


def run_cloud_attempt(job_id: str, backend_id: int, *, redelivered: bool = False) -> dict:
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
        record_attempt(
            AttemptRecord(
                job_id=job.pk,
                backend=backend,
                started_at=started_at,
                outcome=exc.outcome,
                error=exc.message,
                status_code=exc.status_code,
                worker=worker,
            )
        )
        error = hand_on(job, claim.token, backend, exc)
        if error is not None:
            Job.objects.store_outcomes(
                claim.token, [Outcome(job=job, error=error, started_at=started_at)]
            )
        return {"claimed": True, "backend": backend.name, "outcome": exc.outcome}
    record_attempt(
        AttemptRecord(
            job_id=job.pk,
            backend=backend,
            started_at=started_at,
            outcome=AttemptOutcome.SUCCEEDED,
            status_code=result.status_code,
            input_tokens=result.input_tokens,
            output_tokens=result.output_tokens,
            worker=worker,
        )
    )
    # After the attempt row, so whoever sees the job succeeded also sees how.
    Job.objects.store_outcomes(
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
