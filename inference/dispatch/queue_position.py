"""Why a queued job waits, how much work is ahead of it, and when it should start and finish;
and the reasons a tenant's line of a tier queue waits (the admin's queue page). One module, so
the job's REST answer and the operator's page never disagree.

The order modelled is the one the workers serve (inference.workers.tier_reader and
inference.dispatch.fair_share): realtime strictly first; then the tiers below it by weighted
share, counted in jobs; inside a tier queue, tenants by start-time fair queuing, charged in
tokens over their plan weight. Postgres, the record of every job, gives the backlog; the
measured throughput of the local workers (routing.capacity) turns jobs ahead into seconds, and
the batch cost model (inference.scheduling.cost_model) predicts the job's own run.
"""

from __future__ import annotations

import bisect
import json
import math
import time
from array import array
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from itertools import accumulate

import redis
from django.conf import settings
from django.db import connection
from django.db.models import Count, F, Q, QuerySet, Sum, TextField
from django.db.models.functions import Cast, Length
from django.utils import timezone

from inference.config.plans import plan_weight
from inference.config.tiers import current_tier_policies
from inference.jobs.kinds import CHARS_PER_TOKEN, kind_of
from inference.jobs.tiers import TIER_NAMES, Tier
from inference.metrics.queue_depth import (
    WAITING_TIER,
    queued_jobs,
    service_depth,
    tenant_depths,
)
from inference.models import Job, JobStatus, Service, Tenant
from inference.scheduling.cost_model import BatchCostModel
from renq_site.shared_redis import shared_redis
from routing.capacity import PRIOR_BATCH_RUN_S, local_throughput
from routing.limits import RateLimitTracker

# Share of max_queue_size only realtime jobs may fill: a backlog of batch work never locks
# realtime traffic out (admission enforces it; the reasons and Retry-After read it here).
P0_RESERVED_FRACTION = 0.1

WAIT_REASONS = {
    "queue_full": "the service's queue is at max_queue_size for this tenant (its own jobs and "
    "each other tenant's up to its share): new jobs of this tier are refused",
    "tenant_quota": "the tenant has max_running_jobs queued or running: new jobs are refused",
    "backend_cooldown": "the backend the job is routed to is cooling down after a rate limit",
    "tier_share": "a higher tier has queued work: realtime first, then the tiers' weighted share",
    "tenant_fair_share": "another tenant has queued work in this tier: tenants take turns",
    "next_in_line": "nothing ahead of it but its own tier's line: waiting for a worker's batch",
}

ACTIVE_STATUSES = (JobStatus.QUEUED, JobStatus.RUNNING)
# Queued jobs carry no token count until they run: the JSON size over the kinds' chars/token.
ESTIMATED_TOKENS = Length(Cast("input", TextField())) / CHARS_PER_TOKEN
# When a full queue's refused client may retry: not so soon that its retry is refused again
# at once, and never so long that it gives up.
RETRY_AFTER_BOUNDS_S = (0.1, 60.0)


def queue_allowance(service: Service, tier: str) -> int:
    """Queued jobs the service admits for a job of this tier: realtime may fill the whole
    queue, the other tiers all but the realtime reserve."""
    limit = service.max_queue_size
    return limit if tier == Tier.REALTIME else limit - int(limit * P0_RESERVED_FRACTION)


def tenant_queue_share(service: Service, tier: str) -> int:
    """The most of one tenant's queued jobs that count against another tenant's room
    (RENQ_TENANT_QUEUE_SHARE of the tier's allowance, at least one job): whatever one
    tenant queues, a flood or a bulk job's pieces, the others keep the rest."""
    return max(1, math.ceil(settings.RENQ_TENANT_QUEUE_SHARE * queue_allowance(service, tier)))


def queue_full_for(
    service: Service, tenant_id: int, tier: str, depths: dict[int, int] | None = None
) -> bool:
    """Whether admission refuses the tenant a job of this tier now: its own queued jobs plus
    each other tenant's up to the share fill the allowance. `depths`: tenant_depths(service),
    if already read."""
    if not service.max_queue_size:
        return False
    depths = tenant_depths(service) if depths is None else depths
    share = tenant_queue_share(service, tier)
    counted = sum(n if tenant == tenant_id else min(n, share) for tenant, n in depths.items())
    return counted >= queue_allowance(service, tier)


def wait_reasons(
    *,
    queue_full: bool,
    at_quota: bool,
    cooling_down: bool = False,
    higher_tiers_waiting: bool,
    other_tenants_waiting: bool,
) -> list[str]:
    """Every reason that holds, most binding first; `next_in_line` when none does."""
    reasons = [
        name
        for name, holds in (
            ("queue_full", queue_full),
            ("tenant_quota", at_quota),
            ("backend_cooldown", cooling_down),
            ("tier_share", higher_tiers_waiting),
            ("tenant_fair_share", other_tenants_waiting),
        )
        if holds
    ]
    return reasons or ["next_in_line"]


def _active_jobs() -> QuerySet:
    """The jobs max_running_jobs counts (admission's own count: every service, bulk pieces
    aside)."""
    return Job.objects.filter(status__in=ACTIVE_STATUSES, parent__isnull=True)


def tenants_at_quota(tenant_ids: Iterable[int]) -> set[int]:
    """The tenants with max_running_jobs jobs queued or running: their new jobs are refused
    with 429."""
    return set(
        _active_jobs()
        .filter(tenant_id__in=list(tenant_ids))
        .values("tenant_id", "tenant__max_running_jobs")
        .annotate(active=Count("id"))
        .filter(tenant__max_running_jobs__gt=0, active__gte=F("tenant__max_running_jobs"))
        .values_list("tenant_id", flat=True)
    )


def tenant_at_quota(tenant: Tenant) -> bool:
    """tenants_at_quota for one tenant, its jobs counted only as far as its limit."""
    limit = tenant.max_running_jobs
    return bool(limit) and _active_jobs().filter(tenant=tenant)[:limit].count() >= limit


def throughput_jobs_s(service: Service) -> float:
    """Jobs per second the service's local workers get through: measured, else the prior."""
    worker_count = max(service.worker_count, 1)
    prior = service.batch_size / (service.batch_timeout + PRIOR_BATCH_RUN_S) * worker_count
    try:
        rate, _ = local_throughput(
            service.name,
            batch_size=service.batch_size,
            batch_timeout_s=service.batch_timeout,
            worker_count=worker_count,
        )
    except redis.RedisError:
        rate = prior  # an estimate: without the measurement, the service's own settings
    return max(rate, 1e-6)


def predicted_drain_s(service: Service, depth: int | None = None) -> float:
    """How long the service's local workers take to get through its queued jobs."""
    depth = service_depth(service) if depth is None else depth
    return depth / throughput_jobs_s(service)


def retry_after_s(service: Service, depth: int) -> float:
    """When a full queue's refused client may retry: the predicted drain time of its `depth`
    queued jobs, bounded by RETRY_AFTER_BOUNDS_S."""
    low, high = RETRY_AFTER_BOUNDS_S
    return min(high, max(low, predicted_drain_s(service, max(1, depth))))


def _own_run_s(service: Service, tokens: int, per_job_s: float) -> float:
    """The job's own run by the cost model of the service's devices (the slowest measured),
    or one job's share of the throughput before any batch was measured."""
    measured = [cost for cost in BatchCostModel.measured(service.name).values() if cost.samples]
    if not measured:
        return per_job_s
    return max(cost.predict_s(tokens) for cost in measured)


def _cooling_down(job: Job) -> bool:
    backend = job.current_backend()
    if backend is None:
        return False
    try:
        return RateLimitTracker(shared_redis()).status(backend).cooling_down
    except redis.RedisError:
        return False  # a statistic: no answer means no cooldown shown


# A service's queue at least this deep (jobs its local workers take) is read whole at most
# once per DEEP_BACKLOG_KEPT_S in a process: every queued job's page explains its wait, and
# each read of it costs PostgreSQL in proportion to the whole backlog. A job's own tenant's
# line is read at each explanation unless it is that deep itself: then its jobs' order is
# kept as long, and a job finds its place in it.
DEEP_BACKLOG_JOBS = 1_000
DEEP_BACKLOG_KEPT_S = 1.0


@dataclass
class _Line:
    """One (tier, tenant) backlog of the service's queued jobs."""

    tier: str
    tenant_id: int
    plan: str
    jobs: int
    tokens: int
    # This job's own tenant and tier only: its jobs queued before it.
    earlier_jobs: int = 0
    earlier_tokens: int = 0


@dataclass(frozen=True)
class _Backlog:
    """A deep queue's lines and its tenants' depths (admission's), read at `read_at`."""

    lines: list[_Line]
    tenant_depths: dict[int, int]
    read_at: float


# Service id → its deep backlog as last read by this process.
_deep_backlogs: dict[int, _Backlog] = {}


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def _micros(moment: datetime) -> int:
    return (moment - _EPOCH) // _MICROSECOND


@dataclass(frozen=True)
class _TierOrder:
    """One tenant's queued jobs of one tier by created_at, in arrays (a deep backlog may hold
    millions): each distinct created_at, and the running count and tokens of the jobs up to
    and including it."""

    created_us: array
    running_jobs: array
    running_tokens: array

    def before(self, created_us: int) -> tuple[int, int]:
        """The jobs created before that microsecond, and their tokens."""
        i = bisect.bisect_left(self.created_us, created_us)
        return (self.running_jobs[i - 1], self.running_tokens[i - 1]) if i else (0, 0)

    def at(self, created_us: int) -> int:
        """The jobs created at that microsecond (a POST of many jobs shares one)."""
        i = bisect.bisect_left(self.created_us, created_us)
        if i == len(self.created_us) or self.created_us[i] != created_us:
            return 0
        return self.running_jobs[i] - (self.running_jobs[i - 1] if i else 0)


@dataclass(frozen=True)
class _TenantBacklog:
    """One tenant's queued jobs of a deep queue, by waiting tier, read at `read_at`."""

    plan: str
    tiers: dict[str, _TierOrder]
    read_at: float

    def lines(self, job: Job, queued: QuerySet) -> list[_Line]:
        """The tenant's lines, with `job`'s place in each: its jobs queued before it. Jobs
        created in the same microsecond go by id, as the queue's order does: those few are
        read now."""
        created_us = _micros(job.created_at)
        ties = {}
        if sum(order.at(created_us) for order in self.tiers.values()) > 1:
            same = queued.filter(tenant_id=job.tenant_id, created_at=job.created_at)
            ties = {line.tier: line for line in _lines(same, job)}
        lines = []
        for tier, order in self.tiers.items():
            earlier_jobs, earlier_tokens = order.before(created_us)
            if tier in ties:
                earlier_jobs += ties[tier].earlier_jobs
                earlier_tokens += ties[tier].earlier_tokens
            lines.append(
                _Line(
                    tier,
                    job.tenant_id,
                    self.plan,
                    order.running_jobs[-1],
                    order.running_tokens[-1],
                    earlier_jobs,
                    earlier_tokens,
                )
            )
        return lines


# (service id, tenant id) → that tenant's deep backlog as last read by this process.
_tenant_backlogs: dict[tuple[int, int], _TenantBacklog] = {}


def _tenant_backlog(queued: QuerySet, job: Job) -> _TenantBacklog:
    """`job`'s tenant's queued jobs, read at most DEEP_BACKLOG_KEPT_S ago."""
    key = (job.service_id, job.tenant_id)
    kept = _tenant_backlogs.get(key)
    if kept is not None and time.monotonic() - kept.read_at < DEEP_BACKLOG_KEPT_S:
        return kept
    per_moment = (
        queued.filter(tenant_id=job.tenant_id)
        .annotate(waiting_tier=WAITING_TIER)
        .values("waiting_tier", "created_at")
        .annotate(jobs=Count("id"), tokens=Sum(ESTIMATED_TOKENS))
        .order_by()
    )
    sql, params = per_moment.query.sql_with_params()
    # One row per tier, its columns as arrays: a row per created_at would cost the web process
    # Python objects for each of a deep line's tens of thousands.
    in_order = "ORDER BY created_at"
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT waiting_tier,"
            f" array_agg((extract(epoch FROM created_at) * 1000000)::bigint {in_order}),"
            f" array_agg(jobs {in_order}), array_agg(tokens {in_order})"
            f" FROM ({sql}) AS per_moment GROUP BY waiting_tier",
            params,
        )
        tiers = {
            tier: _TierOrder(
                array("q", created_us),
                array("q", accumulate(jobs)),
                array("q", accumulate(int(n or 0) for n in tokens)),
            )
            for tier, created_us, jobs, tokens in cursor.fetchall()
        }
    now = time.monotonic()
    # A tenant no longer polled holds no memory (list(): one step, whatever other threads do).
    for stale, backlog in list(_tenant_backlogs.items()):
        if now - backlog.read_at >= DEEP_BACKLOG_KEPT_S:
            _tenant_backlogs.pop(stale, None)
    kept = _TenantBacklog(job.tenant.plan, tiers, now)
    _tenant_backlogs[key] = kept
    return kept


def explain_wait(job: Job, now: datetime | None = None) -> dict | None:
    """Why a queued job waits and when it should run; None once it is no longer queued.

    `position` counts the service's queued jobs the workers should serve before this one:
    - every queued realtime job, when the job's tier is below realtime (realtime is strict);
    - in the job's own tier queue, its tenant's jobs queued before it, and of each other
      tenant's queued jobs the part the fair share serves meanwhile: their tokens up to this
      tenant's tokens ahead (its earlier jobs and this one) times their plan weight over this
      tenant's (a tenant with a small backlog is wholly ahead, a flood only by its share);
    - for a tier below realtime, of each other non-realtime tier's queued jobs the part the
      tiers' weighted share serves while the own tier's jobs ahead (and this one) are taken:
      those jobs times the other tier's weight over this tier's, at most its backlog.
    Jobs routed to a cloud backend are not counted (the local workers never take them), nor
    bulk parents (their pieces are the jobs). Running jobs are not in `position`, but they
    occupy the workers: half of them count in the time to start.

    `predicted_start` is now + (position + running / 2) / the measured throughput (jobs/s of
    the service's local workers); `predicted_finish` adds the cost model's run of the job's
    own tokens. `reason` is the most binding of `reasons` (see WAIT_REASONS). In a queue of
    DEEP_BACKLOG_JOBS or more, the other tenants' jobs are as read at most DEEP_BACKLOG_KEPT_S
    ago, and so are the tenant's own if it has that many queued.
    """
    if job.status != JobStatus.QUEUED or job.is_bulk:
        return None  # a bulk job's pieces are what wait, each with its own place
    now = now or timezone.now()
    service = job.service
    tier = job.serving_tier or job.tier
    if tier not in TIER_NAMES:
        return None  # a row written without a tier (by hand, not through intake)
    rank = Tier(tier).rank
    local = Job.objects.filter(service=service, is_bulk=False).exclude(
        route__backend__kind="openai"
    )
    queued = local.filter(status=JobStatus.QUEUED)
    kept = _deep_backlogs.get(service.pk)
    if kept is not None and time.monotonic() - kept.read_at < DEEP_BACKLOG_KEPT_S:
        lines = [line for line in kept.lines if line.tenant_id != job.tenant_id]
        if kept.tenant_depths.get(job.tenant_id, 0) >= DEEP_BACKLOG_JOBS:
            # A deep line of its own too: its place in it found in the line as kept.
            lines += _tenant_backlog(queued, job).lines(job, queued)
            depths = kept.tenant_depths
        else:
            # The other tenants' lines as read a moment ago; the job's own tenant's, now.
            lines += _lines(queued.filter(tenant_id=job.tenant_id), job)
            own_depth = queued_jobs().filter(service=service, tenant_id=job.tenant_id).count()
            depths = {**kept.tenant_depths, job.tenant_id: own_depth}
    else:
        lines = _lines(queued, job)
        depths = None
        if sum(line.jobs for line in lines) >= DEEP_BACKLOG_JOBS:
            depths = tenant_depths(service)
            _deep_backlogs[service.pk] = _Backlog(lines, depths, time.monotonic())
        else:
            _deep_backlogs.pop(service.pk, None)
    running = local.filter(status=JobStatus.RUNNING).count()
    # Measured as ESTIMATED_TOKENS measures the others, so the fair share compares like.
    own_tokens = max(1, len(_input_text(job)) // CHARS_PER_TOKEN)

    ahead_jobs, ahead_tokens = 0.0, 0.0
    higher_waiting, others_waiting = False, False
    # Realtime is served strictly before every other tier.
    if rank > 0:
        for line in lines:
            if line.tier == Tier.REALTIME:
                ahead_jobs += line.jobs
                ahead_tokens += line.tokens
                higher_waiting = higher_waiting or line.jobs > 0
    # Inside the tier: the tenant's own earlier jobs, and the others' fair share meanwhile.
    mine = [line for line in lines if line.tier == tier]
    own = next((line for line in mine if line.tenant_id == job.tenant_id), None)
    own_ahead_tokens = (own.earlier_tokens if own else 0) + own_tokens
    own_weight = plan_weight(job.tenant.plan)
    tier_jobs = float(own.earlier_jobs if own else 0)
    tier_tokens = float(own.earlier_tokens if own else 0)
    for line in mine:
        if line.tenant_id == job.tenant_id or not line.jobs:
            continue
        allowed = own_ahead_tokens * plan_weight(line.plan) / max(own_weight, 1e-6)
        part = min(1.0, allowed / max(line.tokens, 1))
        tier_jobs += line.jobs * part
        tier_tokens += line.tokens * part
        others_waiting = others_waiting or part > 0
    ahead_jobs += tier_jobs
    ahead_tokens += tier_tokens
    # Between the tiers below realtime: each other tier's weighted share of the same stretch.
    if rank > 0:
        weights = {t: policy.weight for t, policy in current_tier_policies().items()}
        own_tier_weight = max(weights.get(tier, 0.0), 1e-6)
        for line in lines:
            if line.tier in (tier, Tier.REALTIME) or not line.jobs:
                continue
            share = (tier_jobs + 1) * weights.get(line.tier, 0.0) / own_tier_weight
            part = min(1.0, share / line.jobs)
            ahead_jobs += line.jobs * part
            ahead_tokens += line.tokens * part
            if part > 0 and Tier(line.tier).rank < rank:
                higher_waiting = True

    rate = throughput_jobs_s(service)
    start_s = (ahead_jobs + running / 2) / rate
    input_tokens, output_tokens = kind_of(service.kind).estimate_tokens(job.input)
    run_s = _own_run_s(service, input_tokens + output_tokens, 1 / rate)
    # Admission's count (the queue depth, weighed by tenant), not only the local line's.
    reasons = wait_reasons(
        queue_full=queue_full_for(service, job.tenant_id, tier, depths),
        at_quota=tenant_at_quota(job.tenant),
        cooling_down=_cooling_down(job),
        higher_tiers_waiting=higher_waiting,
        other_tenants_waiting=others_waiting,
    )
    start = now + timedelta(seconds=start_s)
    return {
        "position": math.ceil(ahead_jobs - 1e-9),
        "work_ahead_tokens": round(ahead_tokens),
        "running": running,
        "throughput_jobs_s": round(rate, 3),
        "predicted_start": start.isoformat(),
        "predicted_finish": (start + timedelta(seconds=run_s)).isoformat(),
        "reason": reasons[0],
        "reasons": reasons,
    }


def _lines(queued: QuerySet, job: Job) -> list[_Line]:
    """The (tier, tenant) lines of these queued jobs, with `job`'s own tenant's jobs queued
    before it."""
    own_earlier = Q(tenant_id=job.tenant_id, created_at__lt=job.created_at) | Q(
        tenant_id=job.tenant_id, created_at=job.created_at, pk__lt=job.pk
    )
    rows = (
        queued.annotate(waiting_tier=WAITING_TIER)
        .values("waiting_tier", "tenant_id", "tenant__plan")
        .annotate(
            jobs=Count("id"),
            tokens=Sum(ESTIMATED_TOKENS),
            earlier_jobs=Count("id", filter=own_earlier),
            earlier_tokens=Sum(ESTIMATED_TOKENS, filter=own_earlier),
        )
    )
    return [
        _Line(
            row["waiting_tier"],
            row["tenant_id"],
            row["tenant__plan"],
            row["jobs"],
            int(row["tokens"] or 0),
            row["earlier_jobs"],
            int(row["earlier_tokens"] or 0),
        )
        for row in rows
    ]


def _input_text(job: Job) -> str:
    # As Postgres prints jsonb, so the job's estimate matches ESTIMATED_TOKENS of the others.
    return json.dumps(job.input, separators=(", ", ": "))
