"""Overdue lines: a tenant's interactive work that waits so long for a worker that new work of
the same line would expire in the queue.

A realtime or api job promises to start within its service's queue_timeout (or total_timeout,
if shorter) and expires otherwise. When the workers claim a tenant's jobs of one tier after
more than OVERDUE_FRACTION of that wait, the line (service, tenant, tier) is marked overdue in
Redis for OVERDUE_HOLD_MS, and admission refuses the tenant's new jobs of that line with a 503
and Retry-After instead of accepting them to expire: an expired job cost the web, PostgreSQL
and a claim as much as one that ran, on the machine the model needs, and its client learns
nothing until it looks. The mark is renewed by every late claim, so it holds while the line's
backlog is long and lapses once its jobs start in time again.

By tenant and tier, as the workers serve them: a flooding tenant's line waits, while another
tenant's jobs take their fair turns and start in time, so that tenant is not refused; batch and
offline work promise no start and are never refused here. Measured at the claim, not predicted
from a count: the wait already includes whatever the tenant's jobs wait behind (realtime work,
other tenants' turns, fewer workers than configured).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from datetime import datetime

import redis

from inference.jobs.tiers import promises_latency
from inference.models import Job, Service, Tenant
from renq_site.shared_redis import shared_redis

logger = logging.getLogger(__name__)

# A claim after this share of a job's queue_timeout marks its line overdue: half, so that the
# jobs already waiting in the line still start in time while new ones are refused.
OVERDUE_FRACTION = 0.5
# How long one late claim keeps the line overdue (a backlog's next late claim renews it).
OVERDUE_HOLD_MS = 250
OVERDUE_PREFIX = "renq:overdue:"
# A process asks Redis about one line at most this often: a flood of submissions costs a
# round trip per line and interval, not one per request, and the answer lags by this at most.
CHECK_REUSE_S = 0.1

# key → (time.monotonic() until which it holds, whether the line was overdue).
_checked: dict[str, tuple[float, bool]] = {}


def overdue_key(service_id: int, tenant_id: int, tier: str) -> str:
    return f"{OVERDUE_PREFIX}{service_id}:{tenant_id}:{tier}"


def waited_too_long(job: Job, now: datetime) -> bool:
    """Whether the job, claimed now, waited past OVERDUE_FRACTION of its latency promise (jobs
    that promise none never do)."""
    if not promises_latency(job.tier, job.requested_tier):
        return False
    service = job.service
    promise_s = min(service.queue_timeout, service.total_timeout)
    return (now - job.created_at).total_seconds() > OVERDUE_FRACTION * promise_s


def note_late_claims(jobs: Iterable[Job], now: datetime) -> None:
    """Mark the lines of the claimed (or expired at their claim) jobs that waited too long.
    Best effort: without Redis the line is simply not refused."""
    keys = {
        overdue_key(job.service_id, job.tenant_id, job.tier)
        for job in jobs
        if waited_too_long(job, now)
    }
    if not keys:
        return
    for key in keys:
        _checked.pop(key, None)  # this process sees its own mark at once
    pipe = shared_redis().pipeline(transaction=False)
    for key in keys:
        pipe.set(key, 1, px=OVERDUE_HOLD_MS)
    try:
        pipe.execute()
    except redis.RedisError:
        logger.debug("could not mark %d overdue lines", len(keys), exc_info=True)


def lines_to_check(
    service: Service, tenant: Tenant, tiers: Sequence[str]
) -> tuple[bool, list[str]]:
    """For a request's jobs of `service` in `tiers` (their served tiers, the interactive ones
    only): whether a line this process checked lately was overdue, and the marks to ask Redis
    about (pass their EXISTS answers to `remember`)."""
    now = time.monotonic()
    overdue, ask = False, []
    for tier in dict.fromkeys(tiers):
        key = overdue_key(service.pk, tenant.pk, tier)
        checked = _checked.get(key)
        if checked is not None and checked[0] > now:
            overdue = overdue or checked[1]
        else:
            ask.append(key)
    return overdue, ask


def remember(keys: Sequence[str], answers: Sequence[int]) -> bool:
    """Keep Redis's EXISTS answers for `keys` for CHECK_REUSE_S; whether any line is overdue."""
    until = time.monotonic() + CHECK_REUSE_S
    for key, exists in zip(keys, answers, strict=True):
        _checked[key] = (until, bool(exists))
    return any(answers)


def forget_checks() -> None:
    _checked.clear()
