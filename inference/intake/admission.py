"""Admission control: refuse work early with a status and Retry-After, instead of accepting it
and letting it rot in a queue.

Checked for every submission, a whole request at a time (a bulk or a list of jobs is admitted
or refused whole):
- the service's `rate_limit` (jobs/s per tenant) and the tenant's `requests_per_minute` and
  `monthly_token_budget`: Redis counters shared by every web process, reserved atomically and
  given back when the request is refused further on (429);
- the service's `max_queue_size`: counted and inserted under one per-service advisory lock, in
  one round trip with the INSERTs, so concurrent submitters cannot overshoot it; the last
  `P0_RESERVED_FRACTION` (inference.dispatch.queue_position) of the queue is kept for realtime
  jobs, which are refused only when the queue is truly full (503), with a Retry-After of the
  queue's predicted drain time. A tenant's own queued jobs count in full against its room;
  each other tenant's only up to `RENQ_TENANT_QUEUE_SHARE` of the queue, so no tenant's
  backlog (a flood, a bulk job's pieces) can fill the queue the others need. A bulk job is
  admitted by its own budget: its pieces count against the queue up to that share;
- the tenant's `max_running_jobs` (queued + running): the same, under a per-tenant lock (429);
- a realtime or api job bound for the local workers whose tenant's line of that tier is
  overdue (claimed after more than half their queue_timeout while more of them still wait
  as long, inference.intake.overdue): refused (503) rather than accepted to expire in the queue.

A transaction takes its capacity locks before its running-jobs lock, each kind in id order
(`lock_key` orders them so): two submitters never wait on each other's locks in a circle.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypeVar

from django.db import DatabaseError

from inference.dispatch.publishing import BROKER_AWAY_HOLD_S, broker_seems_away, outbox_wait_s
from inference.dispatch.queue_position import (
    queue_allowance,
    retry_after_s,
    tenant_queue_share,
)
from inference.intake.overdue import (
    OVERDUE_FRACTION,
    overdue_service,
)
from inference.jobs.tiers import Tier
from inference.metrics.events import observe_admission_refused
from inference.models import Job, Service, Tenant
from renq_site.shared_redis import shared_redis

R = TypeVar("R")

# Advisory-lock namespaces of the per-service queue-capacity check and the per-tenant
# running-jobs check; (space, id) is a lock's key, and keys are taken in ascending order.
_CAPACITY_LOCK_SPACE = 7_301
_RUNNING_JOBS_LOCK_SPACE = 7_302
# The SQLSTATE renq_admit_to_queue raises when a request's jobs do not fit the queue.
QUEUE_FULL_SQLSTATE = "RQ503"
# The SQLSTATE the running-jobs check raises when a request's jobs exceed max_running_jobs.
RUNNING_JOBS_SQLSTATE = "RQ429"

LockKey = tuple[int, int]


@dataclass
class AdmissionRefused(Exception):
    status_code: int
    field: str
    message: str
    # When a retry may pass, to the millisecond where admission knows it.
    retry_after_s: float
    # Which limit refused it, e.g. "rate_limit", "requests_per_minute", "max_queue_size".
    quota: str = ""

    def __str__(self) -> str:
        return self.message

    @property
    def retry_headers(self) -> dict[str, str]:
        """Retry-After in whole seconds (RFC 9110), at least one, and retry-after-ms, which
        the OpenAI SDKs and renq_client read first: a refusal that lapses in a fraction of a
        second would otherwise keep its client away, and the model idle, for a whole one."""
        return {
            "Retry-After": str(max(1, math.ceil(self.retry_after_s))),
            "retry-after-ms": str(max(1, round(self.retry_after_s * 1000))),
        }


def counted_refusal(response: R, exc: AdmissionRefused) -> R:
    """A front door's response to `exc`, counted (renq_admission_refused_total) instead of
    logged: a 429 or 503 with Retry-After is admission doing its work, and Django's log line
    per error response (an ERROR per 503) would write one per request of a retry storm."""
    observe_admission_refused(exc.status_code, exc.quota)
    response._has_been_logged = True  # django.utils.log.log_response skips it
    return response


@dataclass
class CounterReservation:
    """Redis counters incremented for a request; `release` gives them back on refusal."""

    keys: list[tuple[str, int]] = field(default_factory=list)

    def release(self) -> None:
        if not self.keys:
            return
        pipe = shared_redis().pipeline()
        for key, amount in self.keys:
            pipe.decrby(key, amount)
        pipe.execute()
        self.keys.clear()


def reserve_counters(
    tenant: Tenant, service: Service, *, jobs: int, tokens: int
) -> CounterReservation:
    """Count the request against the rate limits and the token budget; raise AdmissionRefused
    (429, naming the quota, Retry-After when it frees up) when one is exceeded. One Redis round
    trip for all of them."""
    now = time.time()
    counters: list[tuple[str, int, int, str]] = []  # key, amount, ttl s, quota
    if service.rate_limit:
        key = f"renq:admit:{service.name}:{tenant.pk}:{int(now)}"
        counters.append((key, jobs, 2, "rate_limit"))
    if tenant.requests_per_minute:
        counters.append(
            (f"renq:rpm:{tenant.pk}:{int(now // 60)}", jobs, 120, "requests_per_minute")
        )
    if tenant.monthly_token_budget:
        month = datetime.fromtimestamp(now, UTC).strftime("%Y-%m")
        counters.append(
            (f"renq:tokens:{tenant.pk}:{month}", tokens, 32 * 86400, "monthly_token_budget")
        )
    reservation = CounterReservation()
    if not counters:
        return reservation
    pipe = shared_redis().pipeline(transaction=False)
    for key, amount, ttl_s, _ in counters:
        pipe.incrby(key, amount)
        pipe.expire(key, ttl_s)
    answers = pipe.execute()
    reservation.keys = [(key, amount) for key, amount, _, _ in counters]
    try:
        for i, (_, _, _, quota) in enumerate(counters):
            refusal = _over_quota(quota, int(answers[2 * i]), tenant, service, now)
            if refusal is not None:
                raise refusal
    except AdmissionRefused:
        reservation.release()
        raise
    return reservation


def _over_quota(
    quota: str, count: int, tenant: Tenant, service: Service, now: float
) -> AdmissionRefused | None:
    if quota == "rate_limit" and count > service.rate_limit:
        return AdmissionRefused(
            429,
            "service",
            f"rate limit of {service.rate_limit} jobs/s for service '{service.name}' exceeded.",
            retry_after_s=1 - now % 1,  # counted per second of the clock
            quota=quota,
        )
    if quota == "requests_per_minute" and count > tenant.requests_per_minute:
        return AdmissionRefused(
            429,
            "tenant",
            f"quota requests_per_minute ({tenant.requests_per_minute}) exceeded.",
            retry_after_s=60 - now % 60,
            quota=quota,
        )
    if quota == "monthly_token_budget" and count > tenant.monthly_token_budget:
        month = datetime.fromtimestamp(now, UTC).strftime("%Y-%m")
        return AdmissionRefused(
            429,
            "tenant",
            f"quota monthly_token_budget ({tenant.monthly_token_budget} tokens) exhausted for "
            f"{month}.",
            retry_after_s=_seconds_to_next_month(now),
            quota=quota,
        )
    return None


def refuse_overdue_lines(tenant: Tenant, jobs: Sequence[Job]) -> None:
    """Raise AdmissionRefused (503) when the tenant's line of one of these new jobs is overdue
    (inference.intake.overdue): pass the realtime/api jobs bound for the local workers."""
    overdue = overdue_service(tenant, jobs)
    if overdue is not None:
        raise _overdue_refusal(*overdue)


def refuse_while_broker_away(jobs: Sequence[Job]) -> None:
    """Raise AdmissionRefused (503) for realtime/api jobs while this process's last publish
    failed moments ago, when their service promises a start sooner than the outbox would send
    them: stored now, they would expire first. Other work is still accepted (the outbox
    sends it later)."""
    if broker_seems_away() and any(job.service.start_promise_s < outbox_wait_s() for job in jobs):
        raise AdmissionRefused(
            503,
            "service",
            "the message broker (RabbitMQ) is unavailable: realtime and api jobs would expire "
            "before it is back; retry shortly.",
            retry_after_s=BROKER_AWAY_HOLD_S,
            quota="broker",
        )


def _overdue_refusal(service: Service, retry_after_s: float) -> AdmissionRefused:
    promise_s = service.start_promise_s
    return AdmissionRefused(
        503,
        "service",
        f"your jobs of service '{service.name}' at this priority wait more than "
        f"{OVERDUE_FRACTION * promise_s:g} s for a worker (queue_timeout {promise_s:g} s): new "
        f"ones would expire in the queue; retry later.",
        retry_after_s=retry_after_s,
        quota="queue_timeout",
    )


def _seconds_to_next_month(now: float) -> int:
    today = datetime.fromtimestamp(now, UTC)
    year, month = (today.year + 1, 1) if today.month == 12 else (today.year, today.month + 1)
    return max(1, int(datetime(year, month, 1, tzinfo=UTC).timestamp() - now))


@dataclass(frozen=True)
class QueueCapacityCheck:
    """The service's max_queue_size check as a statement of the submitting transaction, sent
    in the same round trip as its INSERTs: it takes the service's advisory lock (held until
    commit, so concurrent submitters are serialized for one count and none overshoots),
    counts, and aborts the transaction when the jobs do not fit (`renq_admit_to_queue`,
    migration 0017). The lock is held for the server's own work only, never across a round
    trip to the web process, so concurrent submitters wait for a count, not for the network.

    What the jobs must fit: the tenant's own queued jobs, plus each other tenant's up to
    `tenant_queue_share` (inference.dispatch.queue_position), plus these, within the tier's
    allowance. A `bulk` job's pieces count only up to that share too (with the tenant's
    queued jobs): past it they are the bulk's own budget, room no other tenant needed. The
    count reads no further than that (each other tenant's jobs up to the share, the tenant's
    own up to the allowance), so a deep backlog, a bulk's pieces say, costs a submission no
    more than a full queue does."""

    service: Service
    tier: str
    jobs: int
    tenant: Tenant
    bulk: bool = False

    @property
    def lock_key(self) -> LockKey:
        return (_CAPACITY_LOCK_SPACE, self.service.pk)

    @property
    def allowed(self) -> int:
        # Non-realtime work may use the queue up to the reserved margin; realtime all of it.
        return queue_allowance(self.service, self.tier)

    def statement(self) -> tuple[str, list] | None:
        """The SQL and its parameters, or None for a service without a max_queue_size."""
        limit = self.service.max_queue_size
        if not limit:
            return None
        return (
            "SELECT renq_admit_to_queue(%s, %s, %s, %s, %s, %s, %s)",
            [
                _CAPACITY_LOCK_SPACE,
                self.service.pk,
                self.tenant.pk,
                self.allowed,
                tenant_queue_share(self.service, self.tier),
                self.jobs,
                self.bulk,
            ],
        )

    def refusal(self, error: DatabaseError) -> AdmissionRefused | None:
        """The 503 for the error the statement raised, or None for any other error."""
        cause = error.__cause__
        if getattr(cause, "pgcode", None) != QUEUE_FULL_SQLSTATE:
            return None
        service_id, counted = map(int, cause.diag.message_detail.split(":"))
        if service_id != self.service.pk:
            return None  # another service's check of the same request refused it
        service, limit = self.service, self.service.max_queue_size
        # The drain time of the jobs that count against this tenant, at the measured
        # throughput: room frees a job at a time while every refused client retries, so a
        # retry before they drain is refused again.
        retry = retry_after_s(service, counted)
        share = tenant_queue_share(service, self.tier)
        return AdmissionRefused(
            503,
            "service",
            f"service '{service.name}' has {counted} queued jobs counted against you "
            f"(yours, and each other tenant's up to {share}; max_queue_size {limit}"
            + ("" if self.tier == Tier.REALTIME else f", {self.allowed} for non-realtime work")
            + f"); {self.jobs} more do not fit; retry later.",
            retry_after_s=retry,
            quota="max_queue_size",
        )


# The count and the refusal in one statement, as renq_admit_to_queue (migration 0011) does for
# the queue; a DO block rather than a function, so no migration: it takes no parameters, and
# the integers written into it are the check's own. Its queries each take a new snapshot, so
# the count, taken after the lock, sees every job the lock's previous holder committed.
_RUNNING_JOBS_SQL = """DO $renq$
DECLARE
    active integer;
BEGIN
    PERFORM pg_advisory_xact_lock({space}, {tenant});
    SELECT count(*) INTO active FROM (
        SELECT 1 FROM inference_job
        WHERE tenant_id = {tenant} AND status IN ('queued', 'running') AND parent_id IS NULL
        LIMIT {limit}
    ) AS running;
    IF active + {jobs} > {limit} THEN
        RAISE EXCEPTION USING ERRCODE = '{sqlstate}', DETAIL = {tenant} || ':' || active,
            MESSAGE = 'max_running_jobs of tenant {tenant} reached';
    END IF;
END
$renq$"""


@dataclass(frozen=True)
class RunningJobsCheck:
    """The tenant's max_running_jobs (its queued and running jobs, bulk pieces aside) as a
    statement of the submitting transaction, like QueueCapacityCheck: the tenant's advisory
    lock, held until commit, then the count, and an abort when the new jobs do not fit.
    Counted outside the lock, concurrent submitters would each see room for themselves."""

    tenant: Tenant
    jobs: int

    @property
    def lock_key(self) -> LockKey:
        return (_RUNNING_JOBS_LOCK_SPACE, self.tenant.pk)

    def statement(self) -> tuple[str, list] | None:
        """The SQL and its (no) parameters, or None for a tenant without the quota or a
        request that adds no running job (all of it answered from the cache)."""
        limit = self.tenant.max_running_jobs
        if not limit or not self.jobs:
            return None
        sql = _RUNNING_JOBS_SQL.format(
            space=_RUNNING_JOBS_LOCK_SPACE,
            tenant=int(self.tenant.pk),
            limit=int(limit),
            jobs=int(self.jobs),
            sqlstate=RUNNING_JOBS_SQLSTATE,
        )
        return sql, []

    def refusal(self, error: DatabaseError) -> AdmissionRefused | None:
        """The 429 for the error the statement raised, or None for any other error."""
        cause = error.__cause__
        if getattr(cause, "pgcode", None) != RUNNING_JOBS_SQLSTATE:
            return None
        tenant_id, active = map(int, cause.diag.message_detail.split(":"))
        if tenant_id != self.tenant.pk:
            return None
        limit = self.tenant.max_running_jobs
        return AdmissionRefused(
            429,
            "tenant",
            f"quota max_running_jobs ({limit}) reached: {active} of your jobs are queued or "
            f"running.",
            retry_after_s=1,
            quota="max_running_jobs",
        )
