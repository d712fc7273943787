"""Overdue lines: a tenant's interactive work that waits so long for the local workers that new
work of the same line would expire in the queue.

A realtime or api job promises to start within its service's queue_timeout (or total_timeout,
if shorter) and expires otherwise. When a GPU worker claims a tenant's jobs of one tier after
more than OVERDUE_FRACTION of that wait, and more of that line still queued have waited as
long, the line (service, tenant, tier) is marked overdue in Redis, and admission refuses the
tenant's new jobs of that line bound for the local workers with a 503 and Retry-After instead
of accepting them to expire: an expired job cost the web, PostgreSQL and a claim as much as
one that ran, on the machine the model needs, and its client learns nothing until it looks.
One job that waited alone (a worker starting up, a message left by a stopped worker) marks
nothing.

The mark lapses when the line should take work again: once its queued jobs beyond one full
batch have drained at the service's measured throughput (a new mark holds OVERDUE_HOLD_MS at
least, unless a later claim finds the line drained). The refusal's retry-after-ms tells its
clients to come back half that batch later. A client told less would be refused again while
the backlog drains, and an SDK gives up after a retry or two; one told the whole drain would
come back to an idle model. Told this, it comes back while the last batch is still waiting,
and its new job waits behind that batch at most. Each later late claim predicts the lapse
again, from the jobs then left: the last batches' claims are late too (they waited through
the drain), and they end the mark rather than hold the line a hold longer.

By tenant and tier, as the workers serve them: a flooding tenant's line waits, while another
tenant's jobs take their fair turns and start in time, so that tenant is not refused; batch and
offline work promise no start and are never refused here, and a job the router sends to a cloud
backend does not wait for the local workers. Measured at the claim, not predicted from a count:
the wait already includes whatever the tenant's jobs wait behind (realtime work, other tenants'
turns, fewer workers than configured).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

import redis
from django.db import DatabaseError, InterfaceError

from inference.dispatch.queue_position import throughput_jobs_s
from inference.jobs.tiers import promises_latency
from inference.models import Job, JobStatus, Service, Tenant
from renq_site.shared_redis import shared_redis
from routing.redis_scripts import registered_script

logger = logging.getLogger(__name__)

# A claim after this share of a job's queue_timeout marks its line overdue: half, so that the
# jobs already waiting in the line still start in time while new ones are refused.
OVERDUE_FRACTION = 0.5
# The least a new mark holds, unless a later late claim finds the line drained.
OVERDUE_HOLD_MS = 250
OVERDUE_PREFIX = "renq:overdue:"
# A process asks Redis about one line at most this often: a flood of submissions costs a
# round trip per line and interval, not one per request, and the answer lags by this at most.
CHECK_REUSE_S = 0.1

# A line's queued jobs are counted this far for its mark's predicted lapse.
MAX_COUNTED_LINE = 10_000

# key → (time.monotonic() until which it holds, when the overdue line's clients should come
# back as time.time(), or None when it was not overdue).
_checked: dict[str, tuple[float, float | None]] = {}

# KEYS[1]: the line's mark. ARGV: its predicted lapse and when its clients should come back;
# for a line not marked yet, the earliest of either (now + the hold); now; all epoch ms by the
# worker's clock. The mark holds the time to come back and expires at its lapse, counted from
# now (Redis's clock may differ from the worker's). A mark already set takes the newest
# prediction (fewer jobs left to predict), and goes once that lapse is past: a maximum over
# every claim's noisy prediction would only ever run late.
_MARK = """
local lapse, back, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
if redis.call('EXISTS', KEYS[1]) == 1 then
  if lapse <= now then
    redis.call('DEL', KEYS[1])
    return 0
  end
else
  lapse = math.max(lapse, tonumber(ARGV[3]))
  back = math.max(back, lapse)
end
redis.call('SET', KEYS[1], tostring(back), 'PX', tostring(lapse - now))
return 1
"""


def overdue_key(service_id: int, tenant_id: int, tier: str) -> str:
    return f"{OVERDUE_PREFIX}{service_id}:{tenant_id}:{tier}"


def waited_too_long(job: Job, now: datetime) -> bool:
    """Whether the job, claimed now, waited past OVERDUE_FRACTION of its latency promise (jobs
    that promise none never do)."""
    if not promises_latency(job.tier, job.requested_tier):
        return False
    return now - job.created_at > _late_after(job.service)


def note_late_claims(jobs: Iterable[Job], now: datetime) -> None:
    """Mark the lines whose claimed (or expired at their claim) jobs waited too long while more
    of the line, still queued, have waited too long as well. Best effort: without Redis or
    PostgreSQL the line is simply not refused, and the claim goes on."""
    late: dict[tuple[int, int, str], Service] = {
        (job.service_id, job.tenant_id, job.tier): job.service
        for job in jobs
        if waited_too_long(job, now)
    }
    if not late:
        return
    try:
        lapses = {
            overdue_key(*line): _predicted_lapse_ms(service, *line, now)
            for line, service in late.items()
            if _still_waiting_since(*line, now - _late_after(service))
        }
        if not lapses:
            return
        client = shared_redis()
        mark = registered_script(client, _MARK)
        now_ms = int(now.timestamp() * 1000)
        pipe = client.pipeline(transaction=False)
        for key, (lapse_ms, back_ms) in lapses.items():
            _checked.pop(key, None)  # this process sees its own mark at once
            args = [lapse_ms, back_ms, now_ms + OVERDUE_HOLD_MS, now_ms]
            mark(keys=[key], args=args, client=pipe)
        pipe.execute()
    except (DatabaseError, InterfaceError, redis.RedisError):
        logger.debug("could not mark overdue lines", exc_info=True)


def _late_after(service: Service) -> timedelta:
    return timedelta(seconds=OVERDUE_FRACTION * service.start_promise_s)


def _still_waiting_since(service_id: int, tenant_id: int, tier: str, since: datetime) -> bool:
    """Whether one of the line's queued jobs was accepted before `since`: the line is long, not
    one job that waited alone (a worker starting up, a message left from a stopped one)."""
    return Job.objects.filter(
        service_id=service_id,
        status=JobStatus.QUEUED,
        tenant_id=tenant_id,
        tier=tier,
        created_at__lt=since,
    ).exists()


def _predicted_lapse_ms(
    service: Service, service_id: int, tenant_id: int, tier: str, now: datetime
) -> tuple[int, int]:
    """When the line's mark should lapse, and when its refused clients should come back, as
    epoch ms. It lapses once its queued jobs (no new ones join while it is refused) beyond one
    full batch have drained at the service's throughput; they come back half that batch later,
    so that the prediction may be off by half a batch either way, and they still find the line
    open and the model still busy."""
    depth = Job.objects.filter(
        service_id=service_id, status=JobStatus.QUEUED, tenant_id=tenant_id, tier=tier
    )[:MAX_COUNTED_LINE].count()
    jobs_s = throughput_jobs_s(service)
    lapse_s = now.timestamp() + max(0, depth - service.batch_size) / jobs_s
    return int(lapse_s * 1000), int((lapse_s + service.batch_size / 2 / jobs_s) * 1000)


def overdue_service(tenant: Tenant, jobs: Sequence[Job]) -> tuple[Service, float] | None:
    """The service of one of these new jobs whose line (its service, `tenant`, its tier) is
    overdue, with the seconds until its clients should come back; or None. A line this
    process asked Redis about in the last CHECK_REUSE_S is not asked again; without Redis no
    line is overdue."""
    lines = {overdue_key(job.service_id, tenant.pk, job.tier): job.service for job in jobs}
    now, wall = time.monotonic(), time.time()
    ask = []
    for key, service in lines.items():
        checked = _checked.get(key)
        if checked is None or checked[0] <= now:
            ask.append(key)
        elif checked[1] is not None and checked[1] > wall:
            # By then the mark has lapsed: a client back when it was told is taken.
            return service, _seconds_until(checked[1])
    if not ask:
        return None
    pipe = shared_redis().pipeline(transaction=False)
    for key in ask:
        pipe.get(key)
    try:
        answers = pipe.execute()
    except redis.RedisError:
        logger.debug("could not read overdue marks", exc_info=True)
        return None
    until = time.monotonic() + CHECK_REUSE_S
    overdue = None
    for key, mark in zip(ask, answers, strict=True):
        back = None if mark is None else _come_back_at(mark)
        _checked[key] = (until, back)
        if back is not None and overdue is None:
            overdue = lines[key], _seconds_until(back)
    return overdue


def _come_back_at(mark: bytes) -> float:
    """When a mark tells the line's clients to come back, as time.time(). A mark without it
    (an older worker's, "1", which lapses a hold after its late claim) says a hold from now."""
    try:
        back = int(mark) / 1000
    except ValueError:
        back = 0.0
    return back if back > 1 else time.time() + OVERDUE_HOLD_MS / 1000


def _seconds_until(back: float) -> float:
    # A mark read just before its time: the client comes back at once.
    return max(0.001, back - time.time())


def forget_checks() -> None:
    _checked.clear()
