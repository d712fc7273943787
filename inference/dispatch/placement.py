"""Where a job runs: the job lifecycle's use of the routing library.

On submission the job is described to the router (`routing_request`) and its decision is
recorded (`JobRoute`); the publish function then sends the job where that backend says. After
a failed attempt — a GPU batch's error, an I/O worker's HTTP failure, a dead local worker — the
attempt is recorded (inference.dispatch.settlement), the cascade picks the next backend, and
the job is handed on under its claim (`hand_on`): back to queued, the new decision recorded,
one publish after commit. The next worker claims it afresh, so a duplicate message never runs
it twice.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Q

from inference.config.model_files import encoder_max_tokens
from inference.config.models import DEFAULT_TARGET_WAIT_S
from inference.config.tiers import current_tier_policies
from inference.dispatch import queues
from inference.dispatch.broker import consumer_count
from inference.dispatch.publishing import publish_on_commit
from inference.jobs.inputs import UnservableJob
from inference.jobs.kinds import TokenEstimate, kind_of
from inference.jobs.tiers import TIER_ORDER, Tier
from inference.models import Job, JobStatus, Service
from routing.backends.base import BackendError
from routing.capacity import local_throughput
from routing.cascade import FallbackCascade
from routing.models import Backend, JobRoute
from routing.request import LocalWait, RoutingRequest
from routing.router import NoBackendCanServe, Router, RoutingDecision


def tier_target_s(service: Service, tier: str) -> float:
    """Longest local wait a job of this tier accepts: past it the router spills the job to the
    cloud, and the autoscaler adds workers. The tier's `target_wait_s` (config.yaml `tiers:`,
    cached until the configuration changes). Realtime/api jobs expire after queue_timeout and
    promise total_timeout, so the smaller of the two is their target, or caps the configured
    one; batch/offline work without one waits up to DEFAULT_TARGET_WAIT_S."""
    tier = Tier(tier)
    configured = current_tier_policies()[tier.value].target_wait_s
    if tier.is_interactive:
        deadline = service.start_promise_s
        return deadline if configured is None else min(configured, deadline)
    return configured if configured is not None else DEFAULT_TARGET_WAIT_S[tier.value]


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


def model_max_tokens(service: Service) -> int | None:
    """The longest sequence the service's model reads, for the kinds whose engine truncates
    to it (encoders); None for the others."""
    if not kind_of(service.kind).truncates_to_model_length:
        return None
    return encoder_max_tokens(service.model_ref)


def token_estimate(service: Service, payload: dict) -> TokenEstimate:
    """A job's tokens as the service's model reads them (each sequence truncated at its max
    length), estimated before a tokenizer has seen them."""
    return kind_of(service.kind).estimate_tokens(payload, model_max_tokens(service))


def routing_request(job: Job) -> RoutingRequest:
    return routing_request_for(job.service, job.tier, job.input)


def routing_request_for(service: Service, tier: str, payload: dict) -> RoutingRequest:
    estimate = token_estimate(service, payload)
    return RoutingRequest(
        service_id=service.pk,
        service_name=service.name,
        service_kind=service.kind,
        tier=tier,
        input_tokens=estimate.input_tokens,
        output_tokens=estimate.output_tokens,
        workers=ServiceWorkerProbe(service, tier),
        longest_sequence_tokens=kind_of(service.kind).longest_sequence_tokens(payload),
        local_truncation_tokens=model_max_tokens(service),
    )


def check_servable(service: Service, tier: str, payload: dict) -> None:
    """UnservableJob (a 400 naming every backend's reason) when the service has a route and no
    backend of it is configured to serve this input: too large for each, or each
    misconfigured. Static (the configuration, no health): a job refused here would only have
    failed later."""
    refusal = Router.refusal(routing_request_for(service, tier, payload))
    if refusal is not None:
        raise UnservableJob(refusal.reasons, too_large=refusal.too_large)


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
    for a service without a route). Jobs of one request that share service, tier and the
    backends able to serve them share one decision. Decided before the submitting
    transaction, which then holds its lock for the INSERTs alone. UnservableJob when no
    configured backend can serve a job (`check_servable` refuses it earlier; the
    configuration may have changed since)."""
    router = router or Router()
    decisions: dict[tuple[int, str, frozenset[int]], RoutingDecision | None] = {}
    routes = []
    for job in jobs:
        request = routing_request(job)
        key = (job.service_id, job.tier, router.serving_backend_ids(request))
        if key not in decisions:
            try:
                decisions[key] = router.choose(request)
            except NoBackendCanServe as exc:
                raise UnservableJob(exc.reasons, too_large=exc.too_large) from exc
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
