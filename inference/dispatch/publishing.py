"""The one way a job's dispatch message reaches RabbitMQ, always after its row is committed.

Where the message goes is decided by the job alone (`destination`): a job whose current backend
runs on the GPU workers to its service's tier queue, a job routed to a cloud API to the I/O
queue of its tier; a bulk job's pieces likewise, each by its own route. The outbox sweep and every
recovery publish through the same function, so a republished job goes where its backend is.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial

import amqp
from celery.utils.nodenames import anon_nodename
from django.conf import settings
from django.db import DatabaseError, InterfaceError, transaction
from django.db.models import Case, FloatField, Min, Q, Value, When
from django.utils import timezone
from kombu import Connection
from opentelemetry.trace import SpanKind

from inference.config.plans import plan_weight
from inference.dispatch import fair_share, handover, queues
from inference.jobs.kinds import kind_of
from inference.jobs.tiers import Tier
from inference.models import Job, JobStatus, Service, Tenant
from renq_site import tracing
from renq_site.celery import app
from renq_site.shared_redis import shared_redis
from routing.backends import Placement

logger = logging.getLogger(__name__)

RUN_JOB_TASK = "inference.run_job"
CALL_BACKEND_TASK = "inference.call_backend"
# Never consumed by renq: the message is the record (`renq.dead`, inspect it with RabbitMQ).
DEAD_LETTER_TASK = "inference.dead_letter"
# Jobs one dispatch message carries (jobs submitted together, bound for one tier queue): an
# eighth of the service's batch_size, at least 8 and at most 64. Enough that publishing,
# confirming, fetching and acking a message are paid once per several jobs; few enough that
# the jobs a batch cannot take (they wait, claimed, for the worker's next batch) stay a small
# share of a batch and never crowd out other tiers' share.
MIN_JOBS_PER_MESSAGE = 8
MAX_JOBS_PER_MESSAGE = 64
# A publish RabbitMQ has not confirmed by then counts as failed (the outbox sends it again).
CONFIRM_TIMEOUT_S = 10.0
# A realtime job's own message also carries its input (a copy: the input never changes, and
# the row stays the record), so the worker starts its forward pass while it claims the job.
INPUT_HEADER = "renq_input"
# Larger inputs are read at the claim: a copy in the message would cost more than it saves.
MAX_CARRIED_INPUT_BYTES = 4096


# This process's last publish failed (time.monotonic()); None once one succeeds. For so
# long after a failure admission refuses work that promises a start within seconds: the
# broker is likely still away, and such a job would expire before the outbox sends it.
_publish_failed_at: float | None = None
BROKER_AWAY_HOLD_S = 1.0


def broker_seems_away() -> bool:
    """Whether this process's last publish failed less than BROKER_AWAY_HOLD_S ago (after
    that, the next publish tries the broker again)."""
    failed_at = _publish_failed_at
    return failed_at is not None and time.monotonic() - failed_at < BROKER_AWAY_HOLD_S


@dataclass(frozen=True)
class Destination:
    task: str
    args: tuple
    queue: str
    priority: int


def destination(job: Job) -> Destination:
    backend = job.current_backend()
    # The tier queue it waits in: its own, or the one aging promoted it to.
    tier = job.serving_tier or job.tier
    if backend is not None and backend.adapter().placement is Placement.IO_WORKERS:
        return Destination(
            CALL_BACKEND_TASK,
            (str(job.pk), backend.pk),
            queues.io_queue(tier),
            job.message_priority,
        )
    return Destination(
        RUN_JOB_TASK,
        (str(job.pk),),
        queues.tier_queue(job.service.name, tier),
        job.message_priority,
    )


class ConfirmChannels:
    """Broker channels in confirm mode, one per concurrent publisher, kept between publishes.

    Celery's own path (`as_task_v2`, `send_task_message`, kombu's producer pool) builds and
    checks out a producer per message; this sends the same message on a kept channel. A
    channel that fails is dropped: a
    kept one may have died while idle (a broker restart), so that failure is tried once more
    on a new channel; a new one failing raises to the caller.
    """

    def __init__(self, connect: Callable[[], Connection]):
        self._connect = connect
        self._idle: deque[_ConfirmChannel] = deque()
        self._pid = os.getpid()

    def publish(self, message: amqp.Message, queue: str) -> None:
        if self._pid != os.getpid():
            # A forked child must not write on its parent's sockets.
            self._idle, self._pid = deque(), os.getpid()
        while True:
            try:
                channel, kept = self._idle.pop(), True
            except IndexError:
                channel, kept = _ConfirmChannel(self._connect()), False
            try:
                channel.publish(message, queue)
            except Exception:
                channel.close()
                if kept:
                    continue
                raise
            self._idle.append(channel)
            return

    def close_all(self) -> None:
        while self._idle:
            self._idle.pop().close()


class _ConfirmChannel:
    def __init__(self, connection: Connection):
        self._connection = connection
        self._channel = connection.default_channel
        self._declared: set[str] = set()

    def publish(self, message: amqp.Message, queue: str) -> None:
        if queue not in self._declared:
            # Declared as the workers' -Q declares it (x-max-priority), so a message for a
            # service no worker has started yet waits in its queue instead of being dropped.
            app.amqp.queues[queue](self._channel).declare()
            self._declared.add(queue)
        # Mandatory: a queue deleted since it was declared here (the broker lost it) returns
        # the message instead of dropping it, and the failure redeclares it on a new channel.
        self._channel.basic_publish_confirm(
            message,
            exchange="",
            routing_key=queue,
            mandatory=True,
            confirm_timeout=CONFIRM_TIMEOUT_S,
        )

    def close(self) -> None:
        try:
            self._connection.close()
        except Exception:  # noqa: BLE001 - a broken connection is only being let go
            pass


_channels = ConfirmChannels(lambda: app.connection_for_write())


def task_message(
    name: str,
    args: list,
    *,
    priority: int,
    extra_headers: dict | None = None,
    persistent: bool = True,
) -> amqp.Message:
    """The message Celery's worker runs as `name(*args)` (task protocol 2, JSON), with the
    headers `app.amqp.as_task_v2` writes for a task that stores no result."""
    task_id = str(uuid.uuid4())  # Postgres, not the message id, makes runs unique
    headers = {
        "lang": "py",
        "task": name,
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": repr(args),
        "kwargsrepr": "{}",
        "origin": anon_nodename(),  # "gen<pid>@<host>", as Celery writes it
        "ignore_result": True,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
        **(extra_headers or {}),
    }
    tracing.inject(headers)  # the publish span's context, for the worker's spans of its jobs
    body = json.dumps([args, {}, _NO_CANVAS])
    return amqp.Message(
        body,
        content_type="application/json",
        content_encoding="utf-8",
        application_headers=headers,
        delivery_mode=2 if persistent else 1,
        priority=priority,
        correlation_id=task_id,
        reply_to="",
    )


_NO_CANVAS = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}


def publish_task(
    name: str,
    args: list,
    *,
    queue: str,
    priority: int = 0,
    extra_headers: dict | None = None,
    persistent: bool = True,
) -> None:
    """One task message to `queue`, confirmed by RabbitMQ. Raises what the broker raises
    (the callers leave the job to the outbox). A message not `persistent` is confirmed
    without waiting for RabbitMQ's disk, and lost if RabbitMQ restarts."""
    message = task_message(
        name, args, priority=priority, extra_headers=extra_headers, persistent=persistent
    )
    _channels.publish(message, queue)


def _send(target: Destination, jobs: Sequence[Job], tag: fair_share.Tag | None) -> bool:
    # A realtime message skips RabbitMQ's disk (its fsync is on the confirm's path): should
    # RabbitMQ restart, the row in Postgres outlives it and the lost-message sweep publishes
    # it again, by when a realtime job has mostly passed its queue_timeout anyway.
    persistent = any(job.tier != Tier.REALTIME for job in jobs)
    carried = carried_input(jobs[0]) if target.task == RUN_JOB_TASK and len(jobs) == 1 else None
    return _send_ids(
        target, [str(job.pk) for job in jobs], tag, persistent=persistent, carried=carried
    )


def carried_input(job: Job) -> str | None:
    """The input a realtime job's message carries (JSON), or None: not realtime, too large."""
    if (job.serving_tier or job.tier) != Tier.REALTIME:
        return None
    return carried_text(job.input)


def carried_text(job_input: dict) -> str | None:
    """A job input as a message or a head start carries it (JSON), or None: too large."""
    text = json.dumps(job_input)
    return text if len(text) <= MAX_CARRIED_INPUT_BYTES else None


def _send_ids(
    target: Destination,
    job_ids: list[str],
    tag: fair_share.Tag | None,
    *,
    persistent: bool,
    carried: str | None = None,
) -> bool:
    args = list(target.args) if len(job_ids) == 1 else [job_ids]
    priority, headers = target.priority, {}
    if tag is not None:
        priority, headers = tag.priority, {fair_share.START_TAG_HEADER: tag.start}
        if tag.fresh:
            headers[fair_share.FRESH_HEADER] = True
    if carried is not None:
        headers[INPUT_HEADER] = carried
    try:
        with tracing.span("renq.publish", SpanKind.PRODUCER, queue=target.queue, job_ids=job_ids):
            publish_task(
                target.task,
                args,
                queue=target.queue,
                priority=priority,
                extra_headers=headers,
                persistent=persistent,
            )
    except Exception:  # noqa: BLE001 - any broker failure leaves the job for the sweeper
        logger.warning(
            "publishing %d job(s) (%s…) to %s failed; the sweeper will retry",
            len(job_ids),
            job_ids[0],
            target.queue,
            exc_info=True,
        )
        _note_publish(failed=True)
        return False
    _note_publish(failed=False)
    return True


def forget_failed_publish() -> None:
    """As if no publish of this process had failed (tests)."""
    _note_publish(failed=False)


def _note_publish(*, failed: bool) -> None:
    global _publish_failed_at
    _publish_failed_at = time.monotonic() if failed else None


def publish_many(
    jobs: Sequence[Job],
    *,
    counted_on: bool = False,
    charged: bool = False,
    commit_unknown: bool = False,
) -> int:
    """Publish the jobs' dispatch messages (with publisher confirms) and record, in one
    UPDATE, which RabbitMQ confirmed. Jobs bound for the same tier queue travel together, up
    to jobs_per_message in one message (one publish and one confirm instead of one per
    job; the worker claims them together). A job whose publish failed keeps no published_at
    and `republish_unpublished` sends it later, so an accepted job is never lost. Stops at
    the first failure: the broker is away, the sweeper will do the rest.

    `counted_on`: the jobs were stored with published_at already set (the submit path, which
    publishes right after its commit): only a failure is written, so the hot path has no
    second UPDATE per job. Should the process die between commit and publish, the
    lost-message sweep republishes them (queued, published_at past RENQ_LOST_MESSAGE_AFTER_S),
    aging moves them, or their deadline expires them: never silently lost.

    `charged`: the jobs' tenants were charged in the fair share when they were first
    published (a job handed back by a worker, a lost message sent again): they go at the top
    level without a second charge. Their turn had come (a worker was about to run them) or is
    overdue; at the plan's priority they would sink under a flood's released work.

    A submission's message too far ahead of its tier queue's fair-share clock is held back
    (fair_share): its jobs wait in Postgres, counted as dispatched, until `release_held`.
    Should Postgres not take the hold, the message goes out at the released work's level:
    a job counted as published must have a message somewhere.

    A submission's realtime job whose head start an idle worker took is handed over to that
    worker instead (inference.dispatch.handover) when its tenant has no work ahead of the
    queue's virtual time: it is charged and takes its turn at once, and gets no message.

    `commit_unknown`: the connection broke under the jobs' COMMIT, which may still be under
    way; nothing is held (a hold could miss rows not yet committed) nor handed over."""
    jobs = list(jobs)
    sent: list = []
    held: list[tuple[Destination, list[Job], float]] = []
    messages = _messages(jobs)
    holding = counted_on and not commit_unknown
    tags = [None] * len(messages) if charged else _fair_tags(messages, holding=holding)
    handed = _hand_over_taken(messages, tags) if holding else set()
    for (target, group), tag in zip(messages, tags, strict=True):
        if group[0].pk in handed:
            sent.append(group[0].pk)
            continue
        if tag is not None and tag.held:
            held.append((target, group, tag.start))
            continue
        if charged:
            target = replace(target, priority=queues.MAX_PRIORITY)
        if not _send(target, group, tag):
            break
        sent.extend(job.pk for job in group)
    if held and _hold_back(held):
        sent.extend(job.pk for _, group, _ in held for job in group)
    elif held:
        for target, group, start in held:
            if not _send(
                replace(target, priority=RELEASED_PRIORITY),
                group,
                fair_share.Tag(start, RELEASED_PRIORITY),
            ):
                break
            sent.extend(job.pk for job in group)
    if counted_on:
        if len(sent) < len(jobs):
            confirmed = set(sent)
            hand_to_outbox([job.pk for job in jobs if job.pk not in confirmed])
    elif sent:
        Job.objects.filter(pk__in=sent).mark_published()
    return len(sent)


def _hand_over_taken(
    messages: list[tuple[Destination, list[Job]]], tags: list[fair_share.Tag | None]
) -> set[uuid.UUID]:
    """The jobs handed over to the worker that took their head start (handover), each
    message of one job whose submitter offered it (`head_start_offered`). A worker may serve
    a job whose tag is at the top level (its tenant has no work ahead of the virtual time,
    which then moves to its start, as a worker's take moves it); one further ahead goes
    through its queue, as does one served below realtime (past its plan's realtime cap).
    Returns their ids."""
    servable: dict[str, bool] = {}
    starts: dict[str, tuple[str, float]] = {}  # a servable job's queue and start tag
    for (target, group), tag in zip(messages, tags, strict=True):
        job = group[0]
        if len(group) > 1 or target.task != RUN_JOB_TASK or not job.head_start_offered:
            continue
        servable[str(job.pk)] = False
        if (
            (job.serving_tier or job.tier) == Tier.REALTIME
            and tag is not None
            and not tag.held
            and tag.priority == queues.MAX_PRIORITY
        ):
            servable[str(job.pk)] = True
            starts[str(job.pk)] = (target.queue, tag.start)
    if not servable:
        return set()
    with tracing.span("renq.handover", SpanKind.PRODUCER, job_ids=list(servable)):
        handed = handover.answer_takers(shared_redis(), servable)
    taken: dict[str, float | None] = {}
    for job_id in handed:
        queue, start = starts[job_id]
        taken[queue] = max(start, taken.get(queue) or start)
    fair_share.advance(taken)
    return {uuid.UUID(job_id) for job_id in handed}


def _hold_back(held: list[tuple[Destination, list[Job], float]]) -> bool:
    """Hold back each message's jobs at its start tag, in one UPDATE. False when Postgres
    is away: the caller leaves them to the outbox (or the lost-message sweep)."""
    starts = Case(
        *(When(pk__in=[job.pk for job in group], then=Value(start)) for _, group, start in held),
        output_field=FloatField(),
    )
    ids = [job.pk for _, group, _ in held for job in group]
    try:
        Job.objects.filter(pk__in=ids).hold_back(starts)
    except (DatabaseError, InterfaceError):
        logger.warning("could not hold back %d jobs", len(ids), exc_info=True)
        return False
    transaction.on_commit(partial(_holds_committed, held))
    return True


def _holds_committed(held: list[tuple[Destination, list[Job], float]]) -> None:
    """Once the holds are committed: a release can no longer miss them, but one that looked
    just before may have cleared their note, and the queue's workers may have gone idle
    since their last look. fair_share.holds_committed notes them again and says which
    queues nobody takes from; their held work is released here, or it would wait for the
    sweeper."""
    earliest: dict[str, float] = {}
    tiers: dict[str, tuple[str, Tier]] = {}
    for target, group, start in held:
        earliest[target.queue] = min(start, earliest.get(target.queue, start))
        job = group[0]
        tiers[target.queue] = (job.service.name, Tier(job.serving_tier or job.tier))
    for queue in sorted(fair_share.holds_committed(earliest)):
        try:
            release_held(*tiers[queue])
        except (DatabaseError, InterfaceError):
            logger.warning("could not release held work of %s", queue, exc_info=True)


# One release publishes at most this many of the service's batches, and the held start tags
# up to RELEASE_QUANTA quanta beyond the virtual time: the next release is due only after V
# moved about that far, so a drained backlog costs a release every few batches.
RELEASE_BATCHES = 4
RELEASE_QUANTA = 3
# Released work goes two levels under the top: the top is for a tenant with no work ahead of V,
# whose start V precedes them all, the level under it for submissions starting within a
# quantum of V, which would otherwise wait behind every start tag released, a few quanta.
RELEASED_PRIORITY = queues.MAX_PRIORITY - fair_share.RELEASED_BELOW_TOP


def _held_in(service_name: str, tier: Tier):
    in_queue = Q(serving_tier=tier) | Q(serving_tier="", tier=tier)
    return Job.objects.held_back().filter(in_queue, service__name=service_name)


def holds_back(service_name: str, tier: Tier) -> bool:
    """Whether any work is held back from the service's tier queue."""
    return _held_in(service_name, tier).exists()


def release_held(service_name: str, tier: Tier, clock: fair_share.Clock | None = None) -> int:
    """Publish the work held back from the tier queue whose start tags lie within
    RELEASE_QUANTA quanta of the virtual time, or, when none does, of the earliest held one
    (the queue runs short and that one's turn is next); at most RELEASE_BATCHES of the
    service's batches. A tenant's released jobs travel together, in start-tag order; all go
    at one level (RELEASED_PRIORITY): what is out then lies within a few quanta of start
    tags, where arrival order is close to start-tag order, and nothing released sinks below
    later released work. Notes the earliest start tag still held. Returns the jobs published.
    Concurrent releases take different jobs (SKIP LOCKED); a publish that fails, or a
    release that dies before its publishes are confirmed, leaves its jobs to the outbox
    (they are stamped published only once sent). Without Redis's clock the earliest held
    go, at the plan's priority.

    Held jobs are bound for the tier queue of a worker (only those are held), so they are
    published from their ids, without loading them."""
    queue = queues.tier_queue(service_name, tier)
    batch_size = (
        Service.objects.filter(name=service_name).values_list("batch_size", flat=True).first()
    )
    if batch_size is None:
        return 0
    clock = clock or fair_share.clock(queue)
    limit = RELEASE_BATCHES * batch_size
    with transaction.atomic():
        rows = list(
            _held_in(service_name, tier)
            .select_for_update(skip_locked=True, of=("self",))
            .order_by("held_start", "created_at")
            .values_list("pk", "held_start", "tenant_id", "message_priority")[: limit + 1]
        )
        if rows and clock is not None:
            window_end = max(clock.virtual_time, rows[0][1]) + RELEASE_QUANTA * clock.quantum
            taken = [row for row in rows[:limit] if row[1] < window_end]
        else:
            taken = rows[:limit]
        Job.objects.filter(pk__in=[row[0] for row in taken]).release_hold()
    if len(rows) > len(taken):
        earliest = rows[len(taken)][1]
    else:
        # SKIP LOCKED hid the rows a concurrent release has locked, which it may not all
        # take: a note cleared after that release wrote its own would strand them.
        earliest = _held_in(service_name, tier).aggregate(Min("held_start"))["held_start__min"]
    fair_share.note_held(queue, earliest, holds_seen=clock.holds if clock is not None else None)
    per_message = jobs_per_message(batch_size)
    by_tenant: dict[int, list[tuple]] = {}
    for row in taken:
        by_tenant.setdefault(row[2], []).append(row)
    messages = [
        tenant_rows[first : first + per_message]
        for tenant_rows in by_tenant.values()
        for first in range(0, len(tenant_rows), per_message)
    ]
    sent: list = []
    for message in sorted(messages, key=lambda message: message[0][1]):
        ids = [str(row[0]) for row in message]
        start = message[0][1]
        priority = message[0][3] if clock is None else RELEASED_PRIORITY
        target = Destination(RUN_JOB_TASK, (ids[0],), queue, priority)
        tag = fair_share.Tag(start, priority)
        if not _send_ids(target, ids, tag, persistent=True):
            break  # the rest stay unconfirmed: the outbox sends them
        sent.extend(row[0] for row in message)
    if sent:
        _stamp_published(sent)
    return len(sent)


def _stamp_published(job_ids: list) -> None:
    try:
        Job.objects.filter(pk__in=job_ids).mark_published()
    except (DatabaseError, InterfaceError):
        # Sent, unstamped: the outbox sends them once more (a duplicate, dropped at claim).
        logger.warning("could not stamp %d released jobs as published", len(job_ids))


def hand_to_outbox(job_ids: Sequence) -> None:
    """Jobs counted as published that may have no message: the outbox sends them (or, with
    Postgres away too, the lost-message sweep once it is back)."""
    try:
        Job.objects.filter(pk__in=job_ids).unmark_published()
    except (DatabaseError, InterfaceError):
        # Postgres is away too: the lost-message sweep finds these jobs once it is back.
        logger.warning("could not hand %d unpublished jobs to the outbox", len(job_ids))


def jobs_per_message(batch_size: int) -> int:
    """Most jobs one dispatch message to a service batching `batch_size` carries."""
    return max(MIN_JOBS_PER_MESSAGE, min(MAX_JOBS_PER_MESSAGE, batch_size // 8))


def _messages(jobs: Sequence[Job]) -> list[tuple[Destination, list[Job]]]:
    """The messages to send, each with where it goes (its first job's destination)."""
    groups: dict[tuple[str, int], tuple[Destination, list[Job]]] = {}
    messages: list[tuple[Destination, list[Job]]] = []
    for job in jobs:
        target = destination(job)
        if target.task != RUN_JOB_TASK:
            messages.append((target, [job]))  # one per job: cloud calls
            continue
        if job.head_start_offered:
            messages.append((target, [job]))  # its own: it may be handed over (handover)
            continue
        # One tenant's jobs to a message: the fair share charges a message to its tenant.
        key = (target.queue, job.tenant_id)
        group = groups.setdefault(key, (target, []))[1]
        group.append(job)
        if len(group) == jobs_per_message(job.service.batch_size):
            messages.append(groups.pop(key))
    messages.extend(groups.values())
    return messages


def _fair_tags(
    messages: list[tuple[Destination, list[Job]]], *, holding: bool
) -> list[fair_share.Tag | None]:
    """The fair share's tag of each message bound for a tier queue, a service's or the cloud
    calls' (None for all when Redis is away: they go at the plan's static priority).
    `holding`: a message to a worker tier queue below realtime may be held back."""
    if not messages:
        return []
    try:
        plans = _tenant_plans([group[0] for _, group in messages])
        weights = [plan_weight(plans.get(group[0].tenant_id, "")) for _, group in messages]
    except (DatabaseError, InterfaceError):
        # Postgres went away after the jobs' commit: they still go, at the static priority.
        logger.warning("no plan weights for %d messages", len(messages), exc_info=True)
        return [None] * len(messages)
    charges = []
    for (target, group), weight in zip(messages, weights, strict=True):
        first = group[0]
        estimate = kind_of(first.service.kind).estimate_tokens
        charges.append(
            fair_share.Charge(
                queue=target.queue,
                tenant_id=first.tenant_id,
                tokens=sum(estimate(job.input)[0] for job in group),
                jobs=len(group),
                weight=weight,
                batch_jobs=first.service.batch_size,
                batch_tokens=first.service.max_total_tokens,
                holdable=holding
                and target.task == RUN_JOB_TASK
                and (first.serving_tier or first.tier) != Tier.REALTIME,
            )
        )
    computed = fair_share.tag_messages(charges, top=queues.MAX_PRIORITY)
    return [None] * len(messages) if computed is None else list(computed)


def _tenant_plans(jobs: Sequence[Job]) -> dict[int, str]:
    """Tenant id → plan: from the jobs' loaded tenants, else one query for the rest."""
    plans = {job.tenant_id: job.tenant.plan for job in jobs if Job.tenant.is_cached(job)}
    missing = {job.tenant_id for job in jobs} - plans.keys()
    if missing:
        plans.update(Tenant.objects.filter(pk__in=missing).values_list("pk", "plan"))
    return plans


def publish(job: Job) -> bool:
    return publish_many([job]) == 1


def publish_on_commit(job: Job) -> None:
    """Publish once the surrounding transaction commits, so a worker never sees a job that
    does not exist yet (or never will, if the transaction rolls back)."""
    transaction.on_commit(lambda: publish(job))


def publish_many_on_commit(jobs: Sequence[Job], *, counted_on: bool = False) -> None:
    jobs = list(jobs)
    transaction.on_commit(lambda: publish_many(jobs, counted_on=counted_on))


def dead_letter(job_ids: Sequence, reason: str) -> None:
    """A record of each given-up job on `renq.dead`, for operators and their tools (the job
    itself is failed with the reason in Postgres, and the admin can requeue it)."""
    for job_id in job_ids:
        try:
            publish_task(
                DEAD_LETTER_TASK, [str(job_id), reason[:1000]], queue=queues.dead_letter_queue()
            )
        except Exception:  # noqa: BLE001 - the job's own record in Postgres is what counts
            logger.warning("could not publish dead letter of %s", job_id, exc_info=True)


# The outbox sweep sends a job whose publish failed once it is this old (a publish under way
# is not raced).
OUTBOX_AFTER_S = 10.0


def outbox_wait_s() -> float:
    """How long a job whose publish failed may wait for the outbox: OUTBOX_AFTER_S, then up
    to a sweep interval."""
    return OUTBOX_AFTER_S + settings.RENQ_SWEEP_INTERVAL_S


def republish_unpublished(older_than_s: float = OUTBOX_AFTER_S) -> int:
    """The outbox sweep: publish queued jobs whose publish never got confirmed."""
    cutoff = timezone.now() - timezone.timedelta(seconds=older_than_s)
    stale = Job.objects.filter(
        status=JobStatus.QUEUED,
        published_at__isnull=True,
        held_start__isnull=True,  # held back on purpose: released in fair-share order
        created_at__lt=cutoff,
    ).select_related("service", "tenant", "route__backend")[:1000]
    return publish_many(list(stale))
