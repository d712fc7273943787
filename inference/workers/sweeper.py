"""Periodic repairs that keep "nothing accepted is ever lost" true when processes die.

Run by the control worker (`celery worker -Q renq.control -B`, every RENQ_SWEEP_INTERVAL_S)
or by hand (`manage.py sweep_jobs`). Each repair is idempotent: the claim makes a duplicate
message harmless, so republishing is always safe.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from django.conf import settings
from django.db import connection
from django.db.models import Q
from django.utils import timezone

from inference.batch_api.tasks import restart_stalled_batches
from inference.config.tiers import tier_policies
from inference.delivery.waiting import Notice, kept_answers
from inference.dispatch import queues
from inference.dispatch.broker import consumer_count, ready_message_counts
from inference.dispatch.publishing import (
    destination,
    publish,
    publish_many,
    release_held,
    republish_unpublished,
)
from inference.dispatch.settlement import Attempt, local_attempts, settle_attempts
from inference.intake.bulk import finish_stalled_bulks
from inference.jobs.tiers import HIGHEST_PROMOTION, TIER_ORDER, Tier
from inference.jobs.transitions import Outcome
from inference.models import Job, JobStatus, Service
from renq_site.shared_redis import shared_redis
from routing.backends.base import LocalEngineError
from routing.cascade import FallbackCascade
from routing.models import Backend, JobRoute

# A job waiting for workers that are not there (a GPU worker crashed or was stopped, no I/O
# worker runs) is handed to the next fallback once its queues have had no consumer for this
# long: a worker restart, model load included, must not send a backlog to a paid API.
STRANDED_AFTER_S = settings.RENQ_STRANDED_AFTER_S


def take_over_lapsed_leases(now=None) -> int:
    """Jobs whose worker stopped renewing their lease (it hung, died, or lost Postgres) are
    queued and published again; one lost too often is failed instead, and one whose client
    was answered before its store is stored with that answer. A worker that renews meanwhile
    keeps its job: the move names the lapsed lease it takes. Run every
    RENQ_LEASE_CHECK_INTERVAL_S by the control worker. Returns jobs queued again."""
    now = now or timezone.now()
    taken_over = 0
    lapsed = list(
        Job.objects.lapsed(now).select_related("service", "tenant", "route__backend")[:1000]
    )
    answered = kept_answers([job.pk for job in lapsed])
    for job in lapsed:
        if (notice := answered.get(str(job.pk))) is not None:
            _store_answer(job, notice)
            continue
        held = Job.objects.filter(pk=job.pk, claim_token=job.claim_token).lapsed(now)
        if job.attempts >= settings.RENQ_MAX_ATTEMPTS:
            held.fail(f"no result after {job.attempts} attempts; the workers running it were lost")
            continue
        if held.requeue():
            publish(job)  # where its backend is: the local tier queue or an I/O queue
            taken_over += 1
    return taken_over


def _store_answer(job: Job, notice: Notice) -> None:
    """A job whose client was answered before its worker stored the answer (and was lost):
    stored as answered, under the lapsed claim, with its routed attempt, as the worker would
    have stored it. Run again instead, the answer and the row could differ, or the job
    expire in its queue although its client has its result."""
    route = getattr(job, "route", None)
    routed = {job.pk: route.backend_id} if route is not None and route.backend_id else {}
    settle_attempts(job.claim_token, local_attempts([notice.outcome(job)], routed))


# A job that has waited this long since its last publish is published again however long
# its queue is (a duplicate costs one message, dropped at the claim). A job that has waited
# longer is re-sent at most every half of its wait so far, up to this cap: a long backlog
# costs a few duplicates per job, a lost message is still found within a bounded time.
LOST_MESSAGE_RECHECK_MAX_S = 60.0


def republish_lost_messages(now=None, *, lost_after_s: float | None = None) -> int:
    """Queued jobs whose message may be gone (a broker that lost its queues, a worker that
    acked a message and died before claiming) are published again, busy queue or not: at
    once when their queue holds no message at all, else once their last publish is older
    than lost_after_s and than half their wait (at most LOST_MESSAGE_RECHECK_MAX_S). The
    claim runs a job once, so a duplicate is harmless."""
    now = now or timezone.now()
    lost_after_s = settings.RENQ_LOST_MESSAGE_AFTER_S if lost_after_s is None else lost_after_s
    waiting = list(
        Job.objects.filter(
            status=JobStatus.QUEUED,
            is_bulk=False,  # a bulk parent has no message; its pieces do
            published_at__lt=now - timedelta(seconds=lost_after_s),
        ).select_related("service", "tenant", "route__backend")[:5000]
    )
    if not waiting:
        return 0
    targets = {job.pk: destination(job).queue for job in waiting}
    empty = {q for q, n in ready_message_counts(sorted(set(targets.values()))).items() if n == 0}

    def overdue(job: Job) -> bool:
        since_publish_s = (now - job.published_at).total_seconds()
        waited_s = (now - job.created_at).total_seconds()
        return since_publish_s >= min(waited_s / 2, LOST_MESSAGE_RECHECK_MAX_S)

    lost = [job for job in waiting if targets[job.pk] in empty or overdue(job)]
    return publish_many(lost, charged=True)


# One promotion run moves at most this many jobs (in pieces of PROMOTION_CHUNK, oldest first).
PROMOTION_CHUNK = 1000
MAX_PROMOTIONS_PER_RUN = 50_000
# The control worker runs tasks on a few threads (a slow sweep must not hold aging back), so
# two promotion runs may overlap; a session-level advisory lock lets one run at a time (a run
# that finds it held has nothing to add) and is released if its session dies.
_PROMOTION_LOCK_KEY = 0x72656E71  # "renq"


def promote_waiting_jobs(now=None) -> int:
    """Aging for every worker at once: a queued batch/offline job that has waited in its
    tier's queue past the tier's `aging_after_s` is re-published one tier up, and again after
    the next tier's threshold, up to api: nothing is promoted into realtime (P0 stays strict
    for jobs submitted as realtime, so api has no aging_after_s). The copy left in the old
    queue is dropped at claim. Every due job moves in one run (run every
    RENQ_AGING_INTERVAL_S): a backlog submitted at once comes due at once, and a capped run
    would leave the rest past their bound. Returns -1 when another run holds the promotion
    lock.

    The lock covers the moves only, not the publishing (a confirm per message): a lock held
    through a large publish would make the next run skip, and the jobs due meanwhile would
    wait an interval past their bound. Moves still take turns under the lock, so no job is
    moved twice; a job two runs both publish (moved up twice in quick succession) gets a
    second message, dropped at claim."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_try_advisory_lock(%s)", [_PROMOTION_LOCK_KEY])
        if not cursor.fetchone()[0]:
            return -1
    try:
        moved = _move_due_jobs(now or timezone.now())
    finally:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [_PROMOTION_LOCK_KEY])
    return _publish_moved(moved)


def _move_due_jobs(now) -> list:
    """Every due job moved up a tier (one UPDATE per chunk), oldest first per tier; their ids.
    All are moved before any is published: moving the next tier's jobs only after the
    publishes made them that much later."""
    policies = tier_policies()
    moved: dict = {}  # job id -> None, in the order moved (oldest first per tier)
    for own in TIER_ORDER:
        entered_at_s = 0.0  # seconds after submission the job entered `current`
        current = own
        # Tiers at or above HIGHEST_PROMOTION never age (their policy's aging_after_s is 0).
        while current.rank > HIGHEST_PROMOTION.rank:
            threshold_s = policies[current.value].aging_after_s
            if threshold_s <= 0:  # aging switched off for this tier
                break
            entered_at_s += threshold_s
            up = TIER_ORDER[current.rank - 1]
            waiting = Job.objects.filter(
                status=JobStatus.QUEUED,
                tier=own,
                serving_tier="" if current == own else current,
                created_at__lt=now - timedelta(seconds=entered_at_s),
            )
            while len(moved) < MAX_PROMOTIONS_PER_RUN:
                # The longest-waiting first.
                ids = list(
                    waiting.order_by("created_at").values_list("pk", flat=True)[:PROMOTION_CHUNK]
                )
                if not ids:
                    break
                Job.objects.filter(pk__in=ids, tier=own).promote(up)
                moved.update(dict.fromkeys(ids))
                if len(ids) < PROMOTION_CHUNK:
                    break
            current = up
    return list(moved)


def _publish_moved(ids: list) -> int:
    promoted = 0
    for first in range(0, len(ids), PROMOTION_CHUNK):
        # Still queued: a worker may have claimed some from their old queue meanwhile. Each
        # goes to the queue of the tier it was moved to last.
        jobs = Job.objects.filter(
            pk__in=ids[first : first + PROMOTION_CHUNK], status=JobStatus.QUEUED
        ).select_related("service", "tenant", "route__backend")
        promoted += publish_many(list(jobs.order_by("created_at")))
    return promoted


def expire_overdue(now=None) -> int:
    """Jobs nobody started in time are told so while they wait, even with no worker running:
    interactive jobs past their service's queue_timeout (or total_timeout, if shorter), and
    any job past its own deadline (deadline_ms). Run every second by the control worker."""
    now = now or timezone.now()
    expired = Job.objects.filter(deadline_at__lt=now).expire(
        "not started before its deadline (deadline_ms)"
    )
    for service in Service.objects.filter(active=True):
        waited_too_long = service.start_promise_s
        expired += Job.objects.filter(
            service=service,
            tier__in=[Tier.REALTIME, Tier.API],
            created_at__lt=now - timedelta(seconds=waited_too_long),
        ).exclude(
            # Asked as batch/offline, served higher by the plan: no latency promise to break.
            requested_tier__in=[Tier.BATCH, Tier.OFFLINE]
        ).expire("waited longer than the service's queue_timeout before a worker was free")
    return expired


def unconsumed_for_s(name: str, consumers: int) -> float:
    """How long the queues named `name` have had no consumer, as every sweeper sees it (the
    first sweep to find them unconsumed stamps the time in Redis)."""
    key = f"renq:unconsumed:{name}"
    client = shared_redis()
    if consumers > 0:
        client.delete(key)
        return 0.0
    now = time.time()
    client.set(key, now, nx=True, ex=7 * 86400)
    return now - float(client.get(key) or now)


def rescue_stranded_jobs(now=None, *, stranded_after_s: float = STRANDED_AFTER_S) -> int:
    """Jobs routed to a backend whose workers are gone go down the cascade like any failed
    attempt: a failed attempt is recorded and the next fallback gets the job. For a local
    backend that covers queued jobs and the claims of a batch the dead worker was running
    (once inference_timeout has passed, no worker can still be finishing it; should one be,
    its claim token no longer matches and its results are dropped). Interactive jobs already
    past their deadline are expired by the claim instead. Returns jobs handed on."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=stranded_after_s)
    stranded = JobRoute.objects.filter(
        Q(job__status=JobStatus.QUEUED, job__published_at__lt=cutoff)
        | Q(job__status=JobStatus.RUNNING, job__claimed_at__lt=cutoff)
    ).values_list("job__service__name", "backend__kind", "job_id", "backend_id")[:5000]
    groups: dict[tuple[str, str], list[tuple[uuid.UUID, int]]] = {}
    for service_name, backend_kind, job_id, backend_id in stranded:
        # Local jobs wait on their service's queues; cloud jobs on the shared I/O queues.
        group = (service_name, "local") if backend_kind == "local" else ("", "io")
        groups.setdefault(group, []).append((job_id, backend_id))
    cascade = FallbackCascade()
    handed_on = 0
    for (service_name, placement), rows in groups.items():
        if placement == "local":
            names, what = queues.service_tier_queues(service_name), f"the {service_name} queues"
            # A claim older than one inference_timeout cannot belong to a live batch.
            claim_dead_after_s = Service.objects.get(name=service_name).inference_timeout
        else:
            names, what = queues.io_queues(), "the io queues"
            claim_dead_after_s = max(Backend.objects.values_list("timeout_s", flat=True))
        consumers = consumer_count(names)
        unconsumed_s = unconsumed_for_s(service_name or "io", consumers)
        if consumers > 0 or unconsumed_s < stranded_after_s:
            continue  # workers are there (or were, a moment ago): the jobs wait their turn
        handed_on += _hand_on_stranded(
            rows,
            f"no worker consuming {what} for {stranded_after_s:g} s",
            now - timedelta(seconds=claim_dead_after_s),
            cascade,
        )
    return handed_on


def _hand_on_stranded(rows, reason: str, dead_claims_before, cascade: FallbackCascade) -> int:
    backend_of = dict(rows)
    now = timezone.now()
    Job.objects.filter(pk__in=backend_of, claimed_at__lt=dead_claims_before).requeue()
    backends = Backend.objects.in_bulk(set(backend_of.values()))
    claim = Job.objects.claim(list(backend_of), worker="sweeper", count_attempt=False)
    # The stranded attempt failed where the job waited; settling it hands it on like any
    # failed attempt (or fails it with every reason).
    stored = settle_attempts(
        claim.token,
        [
            Attempt(
                Outcome(job=job, error=reason, started_at=now),
                backend=backends[backend_of[job.pk]],
                failure=LocalEngineError(reason),
                worker="sweeper",
            )
            for job in claim.jobs
        ],
        cascade=cascade,
    )
    return len(claim.jobs) - len(stored)


def release_unfed_held() -> int:
    """The next start tags of work held back from a tier queue that holds no message are
    released: workers release held work as they take from a queue, and this covers a queue
    nobody took from since (no worker started yet, or all stopped). Returns the jobs
    released."""
    held = Job.objects.held_back().values_list("service__name", "tier", "serving_tier")
    by_queue = {
        queues.tier_queue(name, serving or tier): (name, Tier(serving or tier))
        for name, tier, serving in held.order_by().distinct()
    }
    if not by_queue:
        return 0
    try:
        counts = ready_message_counts(sorted(by_queue))
    except Exception:  # noqa: BLE001 - the broker is away: nothing could be published anyway
        return 0
    return sum(
        release_held(name, tier)
        for queue, (name, tier) in by_queue.items()
        if counts.get(queue, 0) == 0
    )


def sweep_jobs() -> dict:
    return {
        "republished": republish_unpublished(),
        "held_released": release_unfed_held(),
        "lost_republished": republish_lost_messages(),
        "rescued": rescue_stranded_jobs(),
        "expired": expire_overdue(),
        "bulks_finished": finish_stalled_bulks(),
        "batches_restarted": restart_stalled_batches(),  # the Batch API (inference.batch_api)
    }
