"""Waiting for a job's outcome without polling: Redis pub/sub, one channel per job.

When a job reaches a final status the state machine (inference.jobs.transitions) sends
`jobs_finished`; its receiver here (`notify_finished`) publishes on `renq:job-finished:<job
id>` (a batch's jobs in one Redis command). A job that succeeded is announced with its outcome
(a `Notice`: the stored result and what the answer needs), so a waiting request answers from
the notification without reading the row back; a larger result, or a failure, is announced as
a bare hint to read the row.

A web process waits for all of its requests' jobs on one Redis connection per event loop
(`JobWaiters`). A request chooses its job's id up front (`new_job_id`): the id starts with
the process's own prefix, whose channels the connection listens to by one pattern, so the job
cannot finish unheard, needs no first read, and costs no SUBSCRIBE of its own.

Why Redis pub/sub rather than Postgres LISTEN/NOTIFY: every process already talks to Redis,
the waiting holds no Postgres connection nor thread, and a channel per job means a web process
receives only the notifications its own clients wait for.

Pub/sub is fire-and-forget: a notification lost to a Redis blip is not replayed, so a waiter
also re-reads the job every SAFETY_RECHECK_S. That is a safety net, not the mechanism.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import os
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

import redis
import redis.asyncio
from asgiref.sync import async_to_sync
from django.conf import settings
from django.utils import timezone

from inference.jobs.transitions import Outcome
from inference.jobs.vectors import split_result, with_vectors
from inference.models import Job, JobStatus
from renq_site.shared_redis import shared_redis
from routing.redis_scripts import registered_script

logger = logging.getLogger(__name__)

CHANNEL_PREFIX = "renq:job-finished:"
# A lost notification (Redis restarted under a waiter) costs at most this long.
SAFETY_RECHECK_S = 5.0
# Bound the wait for Redis to confirm a subscription; past it the waiter still works, by
# re-reading the job on the safety interval.
SUBSCRIBE_CONFIRM_TIMEOUT_S = 2.0
# Streamed generations subscribe on a pooled connection each (inference.delivery.streaming);
# past this many per process one waits for a connection, then re-reads on the safety interval.
MAX_SUBSCRIPTIONS = int(os.environ.get("RENQ_FRONT_DOOR_MAX_SUBSCRIPTIONS", "4000"))
# A notification says "read the row" instead of carrying an outcome this large (a bulk of
# embeddings, say): Redis sends a message to one subscriber, but it sits in its buffers.
MAX_NOTICE_BYTES = 256 * 1024
HINT = b"1"
# A notification of a job of this process that nobody waits for yet (its request subscribes
# after submitting it) is kept this long, and at most this many.
UNCLAIMED_KEEP_S = 5.0
MAX_UNCLAIMED = 10_000

T = TypeVar("T")


def job_channel(job_id: str | uuid.UUID) -> str:
    return f"{CHANNEL_PREFIX}{job_id}"


@dataclass
class Notice:
    """A succeeded job's outcome as its notification carries it: what its row holds, or will
    hold once stored (`stored` False: a realtime answer sent before its store)."""

    stored: bool
    result: dict
    vectors: bytes | None
    started_at: datetime | None
    finished_at: datetime
    inference_ms: float | None
    batch_size: int | None
    tokens: int | None
    backend: str | None  # the routed backend that ran it; None for an unrouted service

    def encode(self) -> bytes:
        head = {
            "stored": self.stored,
            "result": self.result,
            "started_at": self.started_at.isoformat() if self.started_at else None,
            "finished_at": self.finished_at.isoformat(),
            "inference_ms": self.inference_ms,
            "batch_size": self.batch_size,
            "tokens": self.tokens,
            "backend": self.backend,
        }
        # JSON, a newline (JSON text has none), then the float32 bytes of any vectors.
        return json.dumps(head, separators=(",", ":")).encode() + b"\n" + (self.vectors or b"")

    def final_job(self, job: Job) -> Job:
        """The submitted `job` as its row reads now: no read back. `noticed_backend` says
        which backend ran it, should its route have moved since it was submitted."""
        final = copy.copy(job)
        final.status = JobStatus.SUCCEEDED
        final.result, final.result_vectors = self.result, self.vectors
        final.started_at, final.finished_at = self.started_at, self.finished_at
        final.inference_ms, final.batch_size = self.inference_ms, self.batch_size
        final.input_tokens = self.tokens
        final.noticed_backend = self.backend
        return final

    def outcome(self, job: Job) -> Outcome:
        """The outcome the notice announced, for `job` (its row): to store it."""
        return Outcome(
            job=job,
            result=with_vectors(self.result, self.vectors),
            started_at=self.started_at,
            inference_ms=self.inference_ms,
            batch_size=self.batch_size,
            tokens=self.tokens,
        )

    @classmethod
    def decode(cls, data: bytes) -> Notice | None:
        """None for a bare hint (or anything else that is not a notice)."""
        head, newline, vectors = data.partition(b"\n")
        if not newline:
            return None
        fields = json.loads(head)
        started = fields["started_at"]
        return cls(
            stored=fields.get("stored", True),
            result=fields["result"],
            vectors=vectors or None,
            started_at=datetime.fromisoformat(started) if started else None,
            finished_at=datetime.fromisoformat(fields["finished_at"]),
            inference_ms=fields["inference_ms"],
            batch_size=fields["batch_size"],
            tokens=fields["tokens"],
            backend=fields["backend"],
        )


def notice_of(outcome: Outcome, finished_at: datetime, *, stored: bool = True) -> bytes:
    """The notification of a success: its Notice, or a bare hint when it is large."""
    result, vectors = split_result(outcome.result)
    notice = Notice(
        stored=stored,
        result=result,
        vectors=vectors,
        started_at=outcome.started_at or finished_at,
        finished_at=finished_at,
        inference_ms=outcome.inference_ms,
        batch_size=outcome.batch_size,
        tokens=outcome.tokens,
        backend=outcome.backend,
    ).encode()
    return notice if len(notice) <= MAX_NOTICE_BYTES else HINT


# One command for a batch's notifications: Redis publishes each message on its channel, so
# the worker pays one round trip per batch, not a PUBLISH per job. ARGV: what to do with the
# answers kept for a lapsed lease ('keep' a notice for the ttl, 'forget', or ''), the ttl,
# then per job its channel, its message and its kept answer's key. A bare hint is not kept.
_PUBLISH_EACH = """
local mode, ttl = ARGV[1], ARGV[2]
for i = 3, #ARGV, 3 do
  redis.call('PUBLISH', ARGV[i], ARGV[i + 1])
  if ARGV[i + 1] ~= '1' then
    if mode == 'keep' then
      redis.call('SET', ARGV[i + 2], ARGV[i + 1], 'PX', ttl)
    elseif mode == 'forget' then
      redis.call('DEL', ARGV[i + 2])
    end
  end
end
return (#ARGV - 2) / 3
"""
KEPT_ANSWER_PREFIX = "renq:answered:"
NOTIFY_CHUNK = 1_000


def kept_answer_key(job_id: str | uuid.UUID) -> str:
    return f"{KEPT_ANSWER_PREFIX}{job_id}"


def kept_answer_ms() -> int:
    """How long an answer sent before its store is kept: past the takeover of the lease of a
    worker that died before storing it."""
    return int(1000 * max(60.0, 4 * (settings.RENQ_LEASE_S + settings.RENQ_LEASE_CHECK_INTERVAL_S)))


def kept_answers(job_ids: Sequence[str | uuid.UUID]) -> dict[str, Notice]:
    """The answers sent before their store that are still unstored, by job id: the client
    has them, so a takeover stores them rather than running the job again. Empty when Redis
    cannot be reached (the jobs then run again)."""
    if not job_ids:
        return {}
    try:
        values = shared_redis().mget([kept_answer_key(job_id) for job_id in job_ids])
    except redis.RedisError:
        logger.warning("kept answers unreadable; %d jobs run again", len(job_ids))
        return {}
    kept = {}
    for job_id, value in zip(job_ids, values, strict=True):
        notice = Notice.decode(value) if value else None
        if notice is not None:
            kept[str(job_id)] = notice
    return kept


def answer_before_store(succeeded: Sequence[Outcome]) -> None:
    """Announce realtime and api successes with their outcome before they are stored (their
    notice says so): a client waiting on one has its answer a store sooner. `succeeded`
    name the backend their store will record. Each notice is also kept in Redis until its
    store's notice forgets it: should the store not happen (the worker dies), the takeover of
    its lease stores what the client was told (inference.workers.sweeper), and a read of the
    job meanwhile answers with it (`answered_job`). Should Redis lose it too, the job runs
    again."""
    if succeeded:
        notify_finished([o.job.pk for o in succeeded], succeeded, stored=False)


def answered_job(job: Job) -> Job:
    """The job as a read shows it: a running job whose client was answered before its store
    reads as that answer (what the store will write), so a read after a REST `?wait=` answer
    sees what it was told. Any other job as it is."""
    return answered_jobs([job])[0]


def answered_jobs(jobs: Sequence[Job]) -> list[Job]:
    """`answered_job` of each, with one Redis read for all the running ones."""
    kept = kept_answers([job.pk for job in jobs if job.status == JobStatus.RUNNING])
    return [kept[str(job.pk)].final_job(job) if str(job.pk) in kept else job for job in jobs]


def notify_finished(
    job_ids: Iterable[str | uuid.UUID], outcomes: Sequence[Outcome] = (), *, stored: bool = True
) -> None:
    """Tell anyone waiting that these jobs reached a final status; `outcomes`: the successes
    among them, announced with their outcome (`stored`: as their rows now hold it). Never
    raises: a waiter that misses this re-reads the job on its own."""
    now = timezone.now()
    notices = {str(o.job.pk): notice_of(o, now, stored=stored) for o in outcomes}
    mode = "" if not notices else "forget" if stored else "keep"
    job_ids = list(job_ids)
    # A cancelled bulk job or an expired backlog may name many thousands: a bounded script
    # call each, so Redis is never held long by one.
    for first in range(0, len(job_ids), NOTIFY_CHUNK):
        args: list = [mode, kept_answer_ms()]
        for job_id in job_ids[first : first + NOTIFY_CHUNK]:
            args += [job_channel(job_id), notices.get(str(job_id), HINT), kept_answer_key(job_id)]
        try:
            registered_script(shared_redis(), _PUBLISH_EACH)(args=args)
        except Exception:  # noqa: BLE001 - never let a notification break storing outcomes
            logger.warning(
                "could not notify waiters of %d finished jobs", len(args) // 3, exc_info=True
            )
            return


def on_jobs_finished(sender, *, job_ids, stored: Sequence[Outcome] = (), **_kwargs) -> None:
    """The state machine's `jobs_finished` (connected in InferenceConfig.ready())."""
    notify_finished(job_ids, stored)


_async_clients: dict[asyncio.AbstractEventLoop, redis.asyncio.Redis] = {}


def async_redis() -> redis.asyncio.Redis:
    """One async client (and connection pool) per event loop: a streamed generation borrows a
    connection for its subscription and gives it back when done, a command one for its round
    trip."""
    loop = asyncio.get_running_loop()
    client = _async_clients.get(loop)
    if client is None:
        for stale in [other for other in _async_clients if other.is_closed()]:
            del _async_clients[stale]
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            settings.RENQ_REDIS_URL,
            max_connections=MAX_SUBSCRIPTIONS,
            timeout=SUBSCRIBE_CONFIRM_TIMEOUT_S,
        )
        client = redis.asyncio.Redis(connection_pool=pool)
        _async_clients[loop] = client
    return client


def _own_prefix() -> str:
    """The first 8 hex digits of the ids of the jobs this process's requests wait for: random
    per process (a forked child draws its own)."""
    global _prefix
    if _prefix is None or _prefix[0] != os.getpid():
        _prefix = (os.getpid(), secrets.token_hex(4))
    return _prefix[1]


_prefix: tuple[int, str] | None = None


def new_job_id() -> uuid.UUID:
    """An id for a job a request of this process will wait for: this process hears its
    notification without a subscription of its own (JobWaiters listens to the pattern of its
    ids). The first 32 bits are the process's, the other 96 a uuid4's (version bits
    included): random enough that ids do not collide."""
    rest = uuid.uuid4().int & ((1 << 96) - 1)
    return uuid.UUID(int=(int(_own_prefix(), 16) << 96) | rest)


class Subscription:
    """One waiter's subscription to one job's channel (`JobWaiters.subscribe`). `confirmed`:
    nothing announced on it since the job could first have finished was missed."""

    def __init__(self, waiters: JobWaiters, channel: str):
        self.channel = channel
        self.messages: asyncio.Queue[bytes] = asyncio.Queue()
        self.confirmed = False
        self._waiters = waiters

    async def next(self, timeout_s: float) -> bytes | None:
        """The next notification on the channel, or None when `timeout_s` passes first."""
        try:
            return await asyncio.wait_for(self.messages.get(), timeout_s)
        except TimeoutError:
            return None

    async def close(self) -> None:
        await self._waiters.unsubscribe(self)


class JobWaiters:
    """Every job channel this process's requests wait on, on one Redis connection per event
    loop. The jobs a request submits itself have ids from `new_job_id`, whose channels the
    connection hears through one pattern subscription made when it opens: waiting for such a
    job costs no Redis command at all. Another job's channel (a job found by its
    Idempotency-Key, say) costs a SUBSCRIBE on the open connection. A reader task hands each
    notification to the subscriptions of its channel, and keeps one for a job of this process
    that nobody waits for yet (UNCLAIMED_KEEP_S), so a waiter may subscribe after submitting.
    Should the connection break, redis-py reconnects and subscribes again, and waiters re-read
    on their interval."""

    def __init__(self) -> None:
        self._pubsub: redis.asyncio.client.PubSub | None = None
        self._reader: asyncio.Task | None = None
        self._by_channel: dict[str, set[Subscription]] = {}
        self._confirmations: dict[str, asyncio.Future] = {}
        self._started = asyncio.Lock()
        # The channels of new_job_id's jobs, heard through one pattern.
        self._own_channels = f"{CHANNEL_PREFIX}{_own_prefix()}"
        self._pattern = f"{self._own_channels}*"
        # time.monotonic() when Redis last confirmed the pattern (None: not listening by it).
        self._pattern_since: float | None = None
        self._unclaimed: dict[str, tuple[float, list[bytes]]] = {}

    async def subscribe(
        self, job_id: str | uuid.UUID, *, since: float | None = None
    ) -> Subscription:
        """Subscribe to the job's channel; `confirmed` once Redis said so (bounded wait).
        `since`: time.monotonic() before the job was submitted, when the subscription is made
        after that (only a job of `new_job_id` can be heard from then on); None: before."""
        channel = job_channel(job_id)
        first = channel not in self._by_channel
        subscription = self._add(channel)
        try:
            await self._start()  # returns at once while the reader runs
            heard_since = self._pattern_since
            if (
                channel.startswith(self._own_channels)
                and heard_since is not None
                and (since is None or heard_since <= since)
            ):
                subscription.confirmed = True
                _, kept = self._unclaimed.pop(channel, (0.0, []))
                for data in kept:
                    subscription.messages.put_nowait(data)
                return subscription
            if first:
                confirmation = asyncio.get_running_loop().create_future()
                self._confirmations[channel] = confirmation
                await self._pubsub.subscribe(channel)
            else:
                confirmation = self._confirmations.get(channel)
            if confirmation is not None:
                await asyncio.wait_for(asyncio.shield(confirmation), SUBSCRIBE_CONFIRM_TIMEOUT_S)
            # Subscribed after the job was submitted: it may have finished unheard.
            subscription.confirmed = since is None
        except (redis.RedisError, OSError, TimeoutError) as exc:
            logger.warning("no Redis subscription for job %s (%s); re-reading instead", job_id, exc)
        return subscription

    def _add(self, channel: str) -> Subscription:
        subscription = Subscription(self, channel)
        self._by_channel.setdefault(channel, set()).add(subscription)
        return subscription

    async def unsubscribe(self, subscription: Subscription) -> None:
        channel = subscription.channel
        others = self._by_channel.get(channel, set())
        others.discard(subscription)
        if others:
            return
        self._by_channel.pop(channel, None)
        if self._confirmations.pop(channel, None) is None:
            return  # never subscribed to: heard through the pattern
        if self._pubsub is not None:
            try:
                await self._pubsub.unsubscribe(channel)
            except (redis.RedisError, OSError):
                pass  # the connection is gone, and the subscription with it

    async def _start(self) -> None:
        if self._reader is not None and not self._reader.done():
            return
        async with self._started:
            if self._reader is not None and not self._reader.done():
                return
            if self._pubsub is None:
                self._pubsub = async_redis().pubsub()
                self._confirmations[self._pattern] = asyncio.get_running_loop().create_future()
                # The pattern also keeps the connection subscribed (and its reader reading)
                # while no request waits.
                await self._pubsub.psubscribe(self._pattern)
            self._reader = asyncio.create_task(self._read())
            confirmation = self._confirmations.get(self._pattern)
            if confirmation is not None:
                await asyncio.wait_for(asyncio.shield(confirmation), SUBSCRIBE_CONFIRM_TIMEOUT_S)

    async def close(self) -> None:
        """Stop reading and close the connection (an event loop that ends with its waiters)."""
        if self._reader is not None:
            self._reader.cancel()
        if self._pubsub is not None:
            try:
                await self._pubsub.aclose()
            except (redis.RedisError, OSError):
                pass  # the connection is gone already

    async def _read(self) -> None:
        pubsub = self._pubsub
        while True:
            try:
                message = await pubsub.get_message(timeout=SAFETY_RECHECK_S)
            except (redis.RedisError, OSError) as exc:
                logger.warning("job notifications interrupted (%s); reconnecting", exc)
                # Notifications may be lost until the pattern is confirmed again.
                self._pattern_since = None
                await asyncio.sleep(0.5)
                continue
            if message is None:
                continue
            kind = message["type"]
            channel = message["channel"]
            channel = channel.decode() if isinstance(channel, bytes) else channel
            if kind == "psubscribe":
                self._pattern_since = time.monotonic()
            if kind in ("subscribe", "psubscribe"):
                confirmation = self._confirmations.get(channel)
                if confirmation is not None and not confirmation.done():
                    confirmation.set_result(True)
            elif kind in ("message", "pmessage"):
                subscriptions = self._by_channel.get(channel)
                if subscriptions:
                    for subscription in subscriptions:
                        subscription.messages.put_nowait(message["data"])
                elif kind == "pmessage":
                    self._keep_unclaimed(channel, message["data"])

    def _keep_unclaimed(self, channel: str, data: bytes) -> None:
        """A notification of this process's job that no waiter subscribed to yet."""
        now = time.monotonic()
        unclaimed = self._unclaimed
        # Oldest first (insertion order): most are a finished waiter's later notices (the
        # stored one after an answer taken before the store), let go here.
        while unclaimed:
            oldest = next(iter(unclaimed))
            if len(unclaimed) < MAX_UNCLAIMED and now - unclaimed[oldest][0] <= UNCLAIMED_KEEP_S:
                break
            del unclaimed[oldest]
        unclaimed.setdefault(channel, (now, []))[1].append(data)


_job_waiters: dict[asyncio.AbstractEventLoop, JobWaiters] = {}


def wait_synchronously(answer: Callable[[], Awaitable[T]]) -> T:
    """Run a waiting view's answer from synchronous code (a WSGI server, Django's test client)
    on an event loop of its own, and close that loop's subscriber connection after it: it is
    not left open until the garbage collector finds it."""

    async def run() -> T:
        try:
            return await answer()
        finally:
            waiters = _job_waiters.pop(asyncio.get_running_loop(), None)
            if waiters is not None:
                await waiters.close()

    return async_to_sync(run)()


def job_waiters() -> JobWaiters:
    """This event loop's JobWaiters."""
    loop = asyncio.get_running_loop()
    waiters = _job_waiters.get(loop)
    if waiters is None:
        for stale in [other for other in _job_waiters if other.is_closed()]:
            del _job_waiters[stale]
        waiters = _job_waiters[loop] = JobWaiters()
    return waiters


async def subscribe(job_id: str | uuid.UUID, *, since: float | None = None) -> Subscription:
    """This event loop's subscription to the job's notification (see JobWaiters)."""
    return await job_waiters().subscribe(job_id, since=since)


async def wait_for_final_job(
    job_id: str | uuid.UUID,
    read_final_job: Callable[[], Awaitable[T | None]],
    *,
    timeout_s: float,
    subscription: Subscription | None = None,
    from_notice: Callable[[Notice], T] | None = None,
) -> T | None:
    """Return the final job, or None when `timeout_s` passes first.

    `read_final_job` reads the job from Postgres and returns it only if it is final; it runs
    once the subscription is confirmed (unless `subscription` was confirmed before the job
    was submitted: then nothing can have been missed), once per notification that carries no
    outcome (a notification may be spurious: it is only a hint to look) and once per
    SAFETY_RECHECK_S. A notification with the job's outcome is answered by `from_notice`,
    without a read, the first one sent before the store too: a read of the job gives the same
    until it is stored (`answered_job`).
    """
    deadline = time.monotonic() + timeout_s
    read_first = subscription is None or not subscription.confirmed
    if subscription is None:
        subscription = await subscribe(job_id)
    try:
        if read_first and (job := await read_final_job()) is not None:
            return job
        while (left_s := deadline - time.monotonic()) > 0:
            data = await subscription.next(min(left_s, SAFETY_RECHECK_S))
            notice = Notice.decode(data) if data and from_notice is not None else None
            if notice is not None:
                return from_notice(notice)
            if (job := await read_final_job()) is not None:
                return job
        return None
    finally:
        await subscription.close()


async def wait_for_any_final(
    job_ids: Sequence[str | uuid.UUID],
    read_any_final: Callable[[], Awaitable[bool]],
    *,
    timeout_s: float,
) -> bool:
    """Wait until one of these jobs is final; False when `timeout_s` passes first.

    `read_any_final` reads the jobs from Postgres and says whether one of them is final. It
    runs once every subscription is confirmed, after each notification (one is only a hint:
    the read decides) and once per SAFETY_RECHECK_S, as `wait_for_final_job`'s does. When
    Redis does not confirm the first subscription, no other is tried."""
    deadline = time.monotonic() + timeout_s
    subscriptions = [await subscribe(job_ids[0])]
    if subscriptions[0].confirmed:
        # Not the others when Redis did not confirm the first: the re-reads stand in for all.
        subscriptions += await asyncio.gather(*(subscribe(job_id) for job_id in job_ids[1:]))
    heard: asyncio.Queue[None] = asyncio.Queue()

    async def relay(subscription: Subscription) -> None:
        while await subscription.next(SAFETY_RECHECK_S) is None:
            pass
        heard.put_nowait(None)

    relays = [asyncio.create_task(relay(subscription)) for subscription in subscriptions]
    try:
        if await read_any_final():
            return True
        while (left_s := deadline - time.monotonic()) > 0:
            try:
                await asyncio.wait_for(heard.get(), min(left_s, SAFETY_RECHECK_S))
            except TimeoutError:
                pass
            if await read_any_final():
                return True
        return False
    finally:
        for task in relays:
            task.cancel()
        await asyncio.gather(*(subscription.close() for subscription in subscriptions))
