"""Where a job runs: the job lifecycle's use of the routing library.

On submission the job is described to the router (`routing_request`) and its decision is
recorded (`JobRoute`); the publish function then sends the job where that backend says. After
a failed attempt — a GPU batch's error, an I/O worker's HTTP failure, a dead local worker — the
attempt is recorded, the cascade picks the next backend, and the job is handed on under its
claim (`hand_on`): back to queued, the new decision recorded, one publish after commit. The
next worker claims it afresh, so a duplicate message never runs it twice.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import redis
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from inference.dispatch import queues
from inference.dispatch.broker import consumer_count
from inference.dispatch.publishing import publish_on_commit
from inference.jobs.kinds import kind_of
from inference.jobs.tiers import TIER_ORDER, Tier
from inference.jobs.transitions import Outcome
from inference.models import Job, JobStatus, Service
from renq_site.shared_redis import shared_redis
from routing.attempts import AttemptOutcome, AttemptRecord, record_attempts
from routing.backends.base import BackendError, LocalEngineError
from routing.breaker import CircuitBreaker
from routing.capacity import local_throughput, record_local_batch
from routing.cascade import FallbackCascade
from routing.models import Backend, JobRoute
from routing.request import LocalWait, RoutingRequest
from routing.router import Router, RoutingDecision

logger = logging.getLogger(__name__)

# Longest local wait that batch/offline work accepts before spilling to the cloud.
NON_INTERACTIVE_TARGET_S = {Tier.BATCH: 15 * 60.0, Tier.OFFLINE: 6 * 3600.0}


def tier_target_s(service: Service, tier: str) -> float:
    """Realtime/api jobs expire after queue_timeout and promise total_timeout, so the smaller
    of the two is their target; batch and offline work waits unless the wait is absurd."""
    tier = Tier(tier)
    if tier.is_interactive:
        return min(service.queue_timeout, service.total_timeout)
    return NON_INTERACTIVE_TARGET_S[tier]


# A routing decision needs the local backlog, not to the job: one COUNT per service and tier
# serves every submission in this window (at hundreds of submissions a second).
JOBS_AHEAD_TTL_S = 0.25
_jobs_ahead: dict[tuple[int, str], tuple[float, int]] = {}


def jobs_ahead(service: Service, tier: str) -> int:
    """Queued jobs of the service in this tier or a higher one (workers serve higher tiers
    first) that wait for the local workers, plus the jobs running now. One indexed COUNT in
    Postgres, the record of truth (RabbitMQ's depth misses jobs pulled into a batch window),
    reused for JOBS_AHEAD_TTL_S."""
    key = (service.pk, str(tier))
    now = time.monotonic()
    cached = _jobs_ahead.get(key)
    if cached is not None and cached[0] > now:
        return cached[1]
    served_first = [t.value for t in TIER_ORDER[: Tier(tier).rank + 1]]
    on_cloud = Q(route__backend__kind="openai")
    count = (
        Job.objects.filter(service=service)
        .filter(Q(status=JobStatus.QUEUED, tier__in=served_first) | Q(status=JobStatus.RUNNING))
        .exclude(on_cloud)
        .count()
    )
    _jobs_ahead[key] = (now + JOBS_AHEAD_TTL_S, count)
    return count


def forget_backlog_counts() -> None:
    _jobs_ahead.clear()


@dataclass
class ServiceWorkerProbe:
    """The workers that would carry out one service's jobs, as the router may ask."""

    service: Service
    tier: str

    def local_consumer_count(self) -> int:
        return consumer_count(queues.service_tier_queues(self.service.name))

    def io_consumer_count(self) -> int:
        return consumer_count(queues.io_queues())

    def predicted_wait(self) -> LocalWait:
        ahead = jobs_ahead(self.service, self.tier)
        throughput, measured = local_throughput(
            self.service.name,
            batch_size=self.service.batch_size,
            batch_timeout_s=self.service.batch_timeout,
            worker_count=self.service.worker_count,
        )
        return LocalWait(
            wait_s=ahead / throughput,
            jobs_ahead=ahead,
            throughput_jobs_s=throughput,
            target_s=tier_target_s(self.service, self.tier),
            measured=measured,
        )


def routing_request(job: Job) -> RoutingRequest:
    service = job.service
    input_tokens, output_tokens = kind_of(service.kind).estimate_tokens(job.input)
    return RoutingRequest(
        service_id=service.pk,
        service_name=service.name,
        service_kind=service.kind,
        tier=job.tier,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        workers=ServiceWorkerProbe(service, job.tier),
    )


def record_decision(job: Job, decision: RoutingDecision) -> JobRoute:
    """Store the decision and cache it on the job, so the publish (and the 202) see it."""
    route, _ = JobRoute.objects.update_or_create(
        job=job,
        defaults={
            "backend": decision.backend,
            "reason": decision.reason[:4000],
            "predicted_local_wait_s": decision.predicted_local_wait_s,
            "scores": decision.scores,
        },
    )
    job.route = route
    return route


def routes_on_submit(jobs: Sequence[Job], router: Router | None = None) -> list[JobRoute]:
    """Choose each new job's backend and why (the JobRoute rows to insert with the jobs; none
    for a service without a route). Jobs of one request that share service and tier share one
    decision. Decided before the submitting transaction, which then holds its lock for the
    INSERTs alone."""
    router = router or Router()
    decisions: dict[tuple[int, str], RoutingDecision | None] = {}
    routes = []
    for job in jobs:
        key = (job.service_id, job.tier)
        if key not in decisions:
            decisions[key] = router.choose(routing_request(job))
        decision = decisions[key]
        if decision is None or decision.backend is None:
            # Cache "no route" on the job: the publish after commit knows it without a query.
            Job.route.related.set_cached_value(job, None)
            continue
        route = JobRoute(
            job=job,
            backend=decision.backend,
            reason=decision.reason[:4000],
            predicted_local_wait_s=decision.predicted_local_wait_s,
            scores=decision.scores,
        )
        job.route = route
        routes.append(route)
    return routes


def hand_on(
    job: Job,
    token: uuid.UUID,
    failed: Backend,
    error: BackendError,
    *,
    cascade: FallbackCascade | None = None,
) -> str | None:
    """Call after the failed attempt is recorded. Hands the job to the next fallback and
    returns None, or returns the error the caller must fail the job with."""
    step = (cascade or FallbackCascade()).next_step(job.pk, routing_request(job), failed, error)
    if step.failure is not None:
        return step.failure
    with transaction.atomic():
        if not Job.objects.filter(pk=job.pk, claim_token=token).requeue():
            return None  # the claim was taken over: its new holder decides
        record_decision(job, step.next)
        publish_on_commit(job)
    return None


def _output_tokens(result: dict | None) -> int:
    usage = (result or {}).get("usage") or {}
    return int(usage.get("completion_tokens") or 0)


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


def settle_local_outcomes(
    token: uuid.UUID,
    outcomes: Sequence[Outcome],
    route_backend_ids: Mapping[uuid.UUID, int],
) -> list[Outcome]:
    """After a GPU batch, once per claim token, before storing outcomes.

    For jobs that went through a route, records their local attempts in one query and hands
    failed ones to the next fallback. Returns the outcomes the worker must still store: all
    of them for unrouted jobs, none for jobs handed on, and for routed jobs whose cascade
    ended, a failure listing every reason. `route_backend_ids`: job id → the backend its
    route chose, as the claim read it (unrouted jobs are not in it).
    """
    if not outcomes:
        return []
    mine = {
        o.job.pk: route_backend_ids[o.job.pk] for o in outcomes if o.job.pk in route_backend_ids
    }
    if not mine:
        return list(outcomes)
    backends = Backend.objects.in_bulk(set(mine.values()))
    routed = {job_id: backends[backend_id] for job_id, backend_id in mine.items()}
    now = timezone.now()
    record_attempts(
        AttemptRecord(
            job_id=o.job.pk,
            backend=routed[o.job.pk],
            started_at=o.started_at or o.job.claimed_at or now,
            outcome=AttemptOutcome.SUCCEEDED if o.result is not None else AttemptOutcome.FAILED,
            error=o.error,
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
    if len(failed) == len(outcomes):
        # Every job failed: the local backend itself is unwell (a single bad input is not).
        breaker = CircuitBreaker(shared_redis())
        try:
            for backend in {routed[o.job.pk] for o in failed}:
                breaker.record_failure(backend)
        except redis.RedisError:
            logger.warning("could not record a local failure on the breaker", exc_info=True)
    cascade = FallbackCascade()
    for outcome in failed:
        error = hand_on(
            outcome.job,
            token,
            routed[outcome.job.pk],
            LocalEngineError(outcome.error),
            cascade=cascade,
        )
        if error is not None:
            keep.append(replace(outcome, error=error))
    return keep


def fail_over_local_error(token: uuid.UUID, job: Job, exc: Exception) -> bool:
    """The local backend could not even start on `job` (e.g. its model failed to load).
    Returns False for an unrouted job (the caller keeps its old behaviour); otherwise the job
    was handed on or failed with every reason."""
    route_backend_ids = dict(JobRoute.objects.filter(job=job).values_list("job_id", "backend_id"))
    if not route_backend_ids:
        return False
    outcomes = settle_local_outcomes(
        token, [Outcome(job=job, error=f"{type(exc).__name__}: {exc}")], route_backend_ids
    )
    if outcomes:
        Job.objects.store_outcomes(token, outcomes)
    return True
