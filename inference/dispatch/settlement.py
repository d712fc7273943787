"""Settling attempts: what a worker does with the outcomes of the jobs it claimed.

The GPU worker settles a pass's outcomes a claim at a time, the I/O worker its one call on a
cloud backend; both through `settle_attempts`. A routed job's attempt is recorded (one INSERT
for all of them), a failed one is handed to the next fallback under the claim
(`placement.hand_on`) or failed with every reason, and what is left is stored. The attempt
row is written before the stored outcome, so whoever sees a job finished also sees how.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

import redis
from django.utils import timezone

from inference.dispatch.placement import hand_on
from inference.jobs.transitions import Outcome
from inference.models import Job
from renq_site.shared_redis import shared_redis
from routing.attempts import AttemptOutcome, AttemptRecord, record_attempts
from routing.backends.base import BackendError, LocalEngineError
from routing.breaker import CircuitBreaker
from routing.capacity import record_local_batch
from routing.cascade import FallbackCascade
from routing.models import Backend, JobRoute
from routing.router import route_entries

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Attempt:
    """One job's try under a claim: the outcome its worker would store and, for a routed job,
    the backend that tried it (None: the job has no route, its outcome is only stored)."""

    outcome: Outcome
    backend: Backend | None = None
    failure: BackendError | None = None  # why it failed, as the cascade weighs it
    status_code: int | None = None
    output_tokens: int = 0
    worker: str = ""

    @property
    def failed(self) -> bool:
        return self.outcome.result is None

    def record(self, now: datetime) -> AttemptRecord:
        outcome = self.outcome
        return AttemptRecord(
            job_id=outcome.job.pk,
            backend=self.backend,
            started_at=outcome.started_at or outcome.job.claimed_at or now,
            outcome=AttemptOutcome.SUCCEEDED if self.failure is None else self.failure.outcome,
            error=outcome.error,
            status_code=self.status_code,
            input_tokens=outcome.tokens or 0,
            output_tokens=self.output_tokens,
            worker=self.worker,
        )


def local_attempts(
    outcomes: Sequence[Outcome], route_backend_ids: Mapping[uuid.UUID, int]
) -> list[Attempt]:
    """One local pass's outcomes under one claim as attempts. `route_backend_ids`: job id →
    the backend its route chose, as the claim read it (unrouted jobs are not in it)."""
    mine = {
        o.job.pk: route_backend_ids[o.job.pk] for o in outcomes if o.job.pk in route_backend_ids
    }
    if not mine:
        return [Attempt(o) for o in outcomes]
    # From the routes the worker keeps cached: a SELECT here was a round trip per batch
    # stored. A backend disabled since the claim is no longer there: read it.
    backends = {
        e.backend_id: e.backend
        for service_id in {o.job.service_id for o in outcomes}
        for e in route_entries(service_id)
    }
    missing = set(mine.values()) - backends.keys()
    if missing:
        backends |= Backend.objects.in_bulk(missing)
    return [
        Attempt(
            o,
            backend=backends[mine[o.job.pk]],
            failure=LocalEngineError(o.error) if o.result is None else None,
            output_tokens=_output_tokens(o.result),
            worker=o.job.worker,
        )
        if o.job.pk in mine
        else Attempt(o)
        for o in outcomes
    ]


def settle_attempts(
    token: uuid.UUID,
    attempts: Sequence[Attempt],
    *,
    all_failed_trips_breaker: bool = False,
    cascade: FallbackCascade | None = None,
) -> list[Outcome]:
    """Record the routed attempts, hand each failed one on (or fail it with every reason) and
    store the rest under the claim `token`. Returns the outcomes stored.

    `all_failed_trips_breaker`, for a local pass: when every attempt failed, the backend
    itself is unwell (a single bad input is not) and its breaker counts a failure. A cloud
    call's breaker is counted by the call itself (routing.calls). `cascade`: one shared by the
    caller's many settlements (the sweep's), else a new one."""
    routed = [a for a in attempts if a.backend is not None]
    stored = [
        a.outcome if a.backend is None else replace(a.outcome, backend=a.backend.name)
        for a in attempts
        if a.backend is None or not a.failed
    ]
    failed = [a for a in routed if a.failed]
    if routed:
        now = timezone.now()
        record_attempts(a.record(now) for a in routed)
    if failed:
        if all_failed_trips_breaker and len(failed) == len(attempts):
            _count_on_breakers({a.backend for a in failed})
        cascade = cascade or FallbackCascade()
        for attempt in failed:
            job = attempt.outcome.job
            error = hand_on(job, token, attempt.backend, attempt.failure, cascade=cascade)
            if error is not None:
                stored.append(replace(attempt.outcome, error=error))
    Job.objects.store_outcomes(token, stored)
    return stored


def fail_over_local_error(token: uuid.UUID, job: Job, exc: Exception) -> bool:
    """The local backend could not even start on `job` (e.g. its model failed to load).
    Returns False for an unrouted job (the caller keeps its old behaviour); otherwise the job
    was handed on or failed with every reason."""
    route_backend_ids = dict(JobRoute.objects.filter(job=job).values_list("job_id", "backend_id"))
    if not route_backend_ids:
        return False
    outcome = Outcome(job=job, error=f"{type(exc).__name__}: {exc}")
    settle_attempts(
        token, local_attempts([outcome], route_backend_ids), all_failed_trips_breaker=True
    )
    return True


def record_local_throughput(outcomes: Sequence[Outcome]) -> None:
    """The local backend's measured throughput (routing's capacity estimate), from one GPU
    batch; called after its outcomes are stored, as it is only a statistic."""
    ran = [o for o in outcomes if o.result is not None and o.inference_ms]
    if not ran:
        return
    try:
        record_local_batch(
            ran[0].job.service.name, ran[0].batch_size or len(ran), ran[0].inference_ms / 1000
        )
    except redis.RedisError:
        # A statistic: losing one sample must not keep a batch's results from being stored.
        logger.warning("could not record local throughput", exc_info=True)


def _count_on_breakers(backends: set[Backend]) -> None:
    breaker = CircuitBreaker(shared_redis())
    try:
        for backend in backends:
            breaker.record_failure(backend)
    except redis.RedisError:
        logger.warning("could not record a local failure on the breaker", exc_info=True)


def _output_tokens(result: dict | None) -> int:
    usage = (result or {}).get("usage") or {}
    return int(usage.get("completion_tokens") or 0)
