"""Waiting for a job's outcome without polling: Redis pub/sub, one channel per job.

When a job reaches a final status the state machine (inference.jobs.transitions) sends
`jobs_finished`; its receiver here (`notify_finished`) publishes on `renq:job-finished:<job
id>` (a batch's jobs in one Redis command). A web request waiting for that job
(`wait_for_final_job`) subscribes to the channel, waits for Redis to confirm the subscription,
and only then reads the job's status once from Postgres: a job that ends between that read and
the wait is still heard of, and one that ended before it is seen by the read.

Why Redis pub/sub rather than Postgres LISTEN/NOTIFY: every process already talks to Redis, a
waiter holds a pooled Redis connection (cheap; Redis serves 10,000 clients by default) instead
of a Postgres connection (100 by default, shared with every query), and a channel per job means
a web process receives only the notifications its own clients wait for. The waiting itself is
async (redis.asyncio): a waiting request holds a socket, never an OS thread.

Pub/sub is fire-and-forget: a notification lost to a Redis blip is not replayed, so a waiter
also re-reads the job every SAFETY_RECHECK_S. That is a safety net, not the mechanism: a
notified job is answered within a millisecond of its outcome being stored.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

import redis
import redis.asyncio
from django.conf import settings
from redis.commands.core import Script

from renq_site.shared_redis import shared_redis

logger = logging.getLogger(__name__)

CHANNEL_PREFIX = "renq:job-finished:"
# A lost notification (Redis restarted under a waiter) costs at most this long.
SAFETY_RECHECK_S = 5.0
# Bound the wait for Redis to confirm a subscription; past it the waiter still works, by
# re-reading the job on the safety interval.
SUBSCRIBE_CONFIRM_TIMEOUT_S = 2.0
# Each waiting request holds one pooled Redis connection for its subscription. Past this many
# per process a waiter queues for a connection (up to SUBSCRIBE_CONFIRM_TIMEOUT_S), then falls
# back to the safety re-read. Redis serves 10,000 clients by default, for every process.
MAX_SUBSCRIPTIONS = int(os.environ.get("RENQ_FRONT_DOOR_MAX_SUBSCRIPTIONS", "4000"))

T = TypeVar("T")


def job_channel(job_id: str | uuid.UUID) -> str:
    return f"{CHANNEL_PREFIX}{job_id}"


# One command for a batch's notifications: Redis publishes on each channel it is given, so
# the worker pays one round trip per batch, not a PUBLISH per job.
_PUBLISH_EACH = """
for _, channel in ipairs(ARGV) do redis.call('PUBLISH', channel, '1') end
return #ARGV
"""
_publish_each: tuple[redis.Redis, Script] | None = None


def _publish_each_script(client: redis.Redis) -> Script:
    global _publish_each
    if _publish_each is None or _publish_each[0] is not client:
        # Run by its SHA; redis-py loads it again should Redis have restarted since.
        _publish_each = (client, client.register_script(_PUBLISH_EACH))
    return _publish_each[1]


def notify_finished(job_ids: Iterable[str | uuid.UUID]) -> None:
    """Tell anyone waiting that these jobs reached a final status. Never raises: the outcome
    is already stored, and a waiter that misses this re-reads the job on its own."""
    channels = [job_channel(job_id) for job_id in job_ids]
    if not channels:
        return
    try:
        _publish_each_script(shared_redis())(args=channels)
    except Exception:  # noqa: BLE001 - never let a notification break storing outcomes
        logger.warning("could not notify waiters of %d finished jobs", len(channels), exc_info=True)


def on_jobs_finished(sender, *, job_ids, **_kwargs) -> None:
    """The state machine's `jobs_finished` (connected in InferenceConfig.ready())."""
    notify_finished(job_ids)


_async_clients: dict[asyncio.AbstractEventLoop, redis.asyncio.Redis] = {}


def _async_redis() -> redis.asyncio.Redis:
    """One async client (and connection pool) per event loop: a waiter borrows a connection
    for its subscription and gives it back when done."""
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


async def wait_for_final_job(
    job_id: str | uuid.UUID,
    read_final_job: Callable[[], Awaitable[T | None]],
    *,
    timeout_s: float,
) -> T | None:
    """Return `read_final_job()`'s answer once it is not None (the job is final), or None when
    `timeout_s` passes first.

    `read_final_job` reads the job from Postgres and returns it only if it is final; it runs
    once after the subscription is confirmed, once per notification (a notification may be
    spurious: it is only a hint to look) and once per SAFETY_RECHECK_S.
    """
    deadline = time.monotonic() + timeout_s
    pubsub = _async_redis().pubsub()
    subscribed = False
    try:
        try:
            await pubsub.subscribe(job_channel(job_id))
            # The first message on a fresh subscription is Redis's confirmation.
            await pubsub.get_message(timeout=SUBSCRIBE_CONFIRM_TIMEOUT_S)
            subscribed = True
        except (redis.RedisError, OSError) as exc:
            logger.warning("no Redis subscription for job %s (%s); re-reading instead", job_id, exc)
        while True:
            job = await read_final_job()
            if job is not None:
                return job
            left_s = deadline - time.monotonic()
            if left_s <= 0:
                return None
            await _next_hint(pubsub if subscribed else None, min(left_s, SAFETY_RECHECK_S))
    finally:
        try:
            await pubsub.aclose()  # unsubscribes and gives the connection back to the pool
        except (redis.RedisError, OSError):
            pass


async def _next_hint(pubsub: redis.asyncio.client.PubSub | None, timeout_s: float) -> None:
    """Block until a notification for the job arrives or `timeout_s` passes."""
    if pubsub is None:
        await asyncio.sleep(timeout_s)
        return
    deadline = time.monotonic() + timeout_s
    try:
        while (left_s := deadline - time.monotonic()) > 0:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=left_s)
            if message is not None:
                return
    except (redis.RedisError, OSError):
        # The subscription broke; sleep out the interval, the caller re-reads the job.
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
