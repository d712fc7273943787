"""The fallback cascade: after a failed attempt, the next backend or the job's failure.

Each backend tries a job at most once (litellm#19985: fallbacks that reset the retry cycle call
models again and again), so a cascade always ends. An error that retrying cannot fix (the
upstream said the input is bad: 400/413/422) ends it at once. A job fails only when no untried,
healthy backend is left, and its `error` then lists every attempt's reason.

Handing a job on is the same move wherever the failure happened (a GPU worker's batch or an
I/O worker's HTTP call): under the claim token, the job goes back to `queued` with its new
backend recorded, and one message is published to that backend's queue after commit. The
next worker claims it afresh, so a duplicate message never runs it twice.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from inference.admission import shared_redis
from inference.claims import Outcome, claim_jobs, store_outcomes
from inference.models import Job, JobStatus, Service
from routing import capacity
from routing.backends.base import BackendError, LocalEngineError
from routing.breaker import CircuitBreaker
from routing.capacity import record_local_batch
from routing.dispatch import publish_to_backend_on_commit, record_decision
from routing.models import AttemptOutcome, Backend, JobAttempt, JobRoute
from routing.router import Router


def is_final(error: BackendError) -> bool:
    """True when no other backend could do better (the job's input was rejected)."""
    return not error.retryable


def failure_message(job: Job, *, skipped: Sequence[str] = (), final: bool = False) -> str:
    attempts = (
        JobAttempt.objects.filter(job=job).select_related("backend").order_by("started_at", "id")
    )
    reasons = [f"{a.backend.name}: {a.error or a.outcome}" for a in attempts]
    reasons.extend(skipped)
    head = (
        "the upstream rejected the input (not retryable)"
        if final
        else f"every backend failed ({len(reasons)})"
    )
    return f"{head}: " + "; ".join(reasons)


def continue_cascade(
    job: Job,
    claim_token: uuid.UUID,
    failed: Backend,
    error: BackendError,
    *,
    router: Router | None = None,
) -> str | None:
    """Call after the failed attempt is recorded. Hands the job to the next fallback and
    returns None, or returns the error the caller must fail the job with."""
    if is_final(error):
        return failure_message(job, final=True)
    tried = set(JobAttempt.objects.filter(job=job).values_list("backend_id", flat=True))
    decision, skipped = (router or Router()).fallback_after(job, failed, tried)
    if decision is None:
        return failure_message(job, skipped=skipped)
    with transaction.atomic():
        handed_on = Job.objects.filter(
            pk=job.pk, claim_token=claim_token, status=JobStatus.RUNNING
        ).update(
            status=JobStatus.QUEUED,
            claim_token=None,
            claimed_at=None,
            started_at=None,
            published_at=None,
            worker="",
        )
        if not handed_on:
            return None  # the claim was taken over: its new holder decides
        record_decision(job, decision)
        publish_to_backend_on_commit(job, decision.backend)
    return None


# A job queued for a local backend is handed on once no GPU worker has been consuming its
# service's queues and it has waited this long since publishing: a worker restart (model
# load included) should not send a backlog to a paid API.
STRANDED_AFTER_S = 5.0


def rescue_stranded_local_jobs(now=None, *, stranded_after_s: float = STRANDED_AFTER_S) -> int:
    """Jobs routed to a local backend whose service has no consuming worker (it crashed, was
    stopped or was never started) go down the cascade like any failed attempt: a local attempt
    is recorded as failed and the next fallback gets the job. That covers queued jobs and the
    claims of a batch the dead worker was running (once inference_timeout has passed, no
    worker can still be finishing it; should one be, its claim token no longer matches and
    its results are dropped, so each job still ends with one result). Interactive jobs
    already past their deadline are expired by the claim instead. Returns jobs handed on."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=stranded_after_s)
    stranded = (
        JobRoute.objects.filter(backend__kind="local")
        .filter(
            Q(job__status=JobStatus.QUEUED, job__published_at__lt=cutoff)
            | Q(job__status=JobStatus.RUNNING, job__claimed_at__lt=cutoff)
        )
        .values_list("job__service__name", "job_id", "backend_id")[:5000]
    )
    by_service: dict[str, list[tuple[uuid.UUID, int]]] = defaultdict(list)
    for service_name, job_id, backend_id in stranded:
        by_service[service_name].append((job_id, backend_id))
    router = Router()
    handed_on = 0
    for service_name, rows in by_service.items():
        if capacity.local_consumer_count(service_name) > 0:
            continue  # a worker is there: the jobs are merely waiting their turn
        backend_of = dict(rows)
        service = Service.objects.get(name=service_name)
        dead_claim_before = now - timedelta(
            seconds=max(stranded_after_s, service.inference_timeout)
        )
        Job.objects.filter(
            pk__in=backend_of, status=JobStatus.RUNNING, claimed_at__lt=dead_claim_before
        ).update(status=JobStatus.QUEUED, claim_token=None, claimed_at=None, started_at=None)
        backends = Backend.objects.in_bulk(set(backend_of.values()))
        claim = claim_jobs([str(job_id) for job_id in backend_of], worker="sweeper")
        reason = f"no worker consuming the {service_name} queues for {stranded_after_s:g} s"
        failed: list[Outcome] = []
        for job in claim.jobs:
            backend = backends[backend_of[job.pk]]
            record_attempt(
                job,
                backend,
                started_at=now,
                outcome=AttemptOutcome.FAILED,
                error=reason,
                worker="sweeper",
            )
            error = continue_cascade(
                job, claim.token, backend, LocalEngineError(reason), router=router
            )
            if error is None:
                handed_on += 1
            else:
                failed.append(Outcome(job=job, error=error))
        if failed:
            store_outcomes(claim.token, failed)
    return handed_on


def record_attempt(
    job: Job,
    backend: Backend,
    *,
    started_at,
    outcome: str,
    error: str = "",
    status_code: int | None = None,
    input_tokens: int = 0,
    output_tokens: int = 0,
    worker: str = "",
) -> JobAttempt:
    return JobAttempt.objects.create(
        job=job,
        backend=backend,
        started_at=started_at,
        finished_at=timezone.now(),
        outcome=outcome,
        status_code=status_code,
        error=error[:4000],
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        cost=backend.cost_of(input_tokens, output_tokens),
        worker=worker[:200],
    )


def _output_tokens(result: dict | None) -> int:
    usage = (result or {}).get("usage") or {}
    return int(usage.get("completion_tokens") or 0)


def settle_local_outcomes(token: uuid.UUID, outcomes: Sequence[Outcome]) -> list[Outcome]:
    """The GPU worker's hook, once per claim token of a batch, before storing outcomes.

    Records the local throughput; for jobs that went through a route, records their local
    attempts in one query and hands failed ones to the next fallback. Returns the outcomes the
    worker must still store: all of them for unrouted jobs, none for jobs handed on, and for
    routed jobs whose cascade ended, a failure listing every reason.
    """
    if not outcomes:
        return []
    ran = [o for o in outcomes if o.result is not None and o.inference_ms]
    if ran:
        record_local_batch(
            ran[0].job.service.name, ran[0].batch_size or len(ran), ran[0].inference_ms / 1000
        )
    routed = dict(
        JobRoute.objects.filter(job_id__in=[o.job.pk for o in outcomes]).values_list(
            "job_id", "backend_id"
        )
    )
    if not routed:
        return list(outcomes)
    now = timezone.now()
    JobAttempt.objects.bulk_create(
        JobAttempt(
            job=o.job,
            backend_id=routed[o.job.pk],
            started_at=o.started_at or o.job.claimed_at or now,
            finished_at=now,
            outcome=AttemptOutcome.SUCCEEDED if o.result is not None else AttemptOutcome.FAILED,
            error=o.error[:4000],
            input_tokens=o.tokens or 0,
            output_tokens=_output_tokens(o.result),
            worker=o.job.worker,
        )
        for o in outcomes
        if o.job.pk in routed
    )
    failed = [o for o in outcomes if o.result is None and o.job.pk in routed]
    keep = [o for o in outcomes if o.result is not None or o.job.pk not in routed]
    if not failed:
        return keep
    backends = Backend.objects.in_bulk({routed[o.job.pk] for o in failed})
    if len(failed) == len(outcomes):
        # Every job failed: the local backend itself is unwell (a single bad input is not).
        breaker = CircuitBreaker(shared_redis())
        for backend in backends.values():
            breaker.record_failure(backend)
    router = Router()
    for outcome in failed:
        error = continue_cascade(
            outcome.job,
            token,
            backends[routed[outcome.job.pk]],
            LocalEngineError(outcome.error),
            router=router,
        )
        if error is not None:
            keep.append(replace(outcome, error=error))
    return keep


def fail_over_local_error(token: uuid.UUID, job: Job, exc: Exception) -> bool:
    """The local backend could not even start on `job` (e.g. its model failed to load).
    Returns False for an unrouted job (the caller keeps its old behaviour); otherwise the job
    was handed on or failed with every reason."""
    if not JobRoute.objects.filter(job=job).exists():
        return False
    outcomes = settle_local_outcomes(
        token, [Outcome(job=job, error=f"{type(exc).__name__}: {exc}")]
    )
    if outcomes:
        store_outcomes(token, outcomes)
    return True
