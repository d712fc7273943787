"""Head starts: a realtime job's input offered to an idle worker of its queue before the job is
committed and published, so that its forward pass runs while the INSERT, the publish and the
delivery are under way instead of after them.

The web pushes an offer (the job's id and input) onto a short Redis list per realtime queue just
before it commits the job; an idle GPU worker of that queue pops it and starts the pass
(inference.workers.gpu.early_pass). The front doors that choose their jobs' ids themselves (the
OpenAI one, and a REST `POST ?wait=`) offer sooner still when they can from what their process
has cached: from the event loop, while the submission goes to its database or request thread
(offer_in_background). Every submit that offered answers the worker that took the offer, and
may hand it the job instead of publishing it (inference.dispatch.handover); an offer without
`answered` (from a web process of an older release) is never answered. Otherwise the message
decides, as for any early pass: the outcome counts only when the job's own message reaches
that worker, its claim returns the job and its first batch is that job alone, whole and with
the input the pass ran on; otherwise the pass is dropped. Either way the claim decides. An
offer is a head start, not a delivery: one lost, late or never taken costs the job nothing,
and a job that is never committed (or refused, or served at another tier) leaves only a pass
nobody adopts.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import redis
import redis.asyncio

from inference.dispatch.publishing import RUN_JOB_TASK, carried_input, destination
from inference.models import Job
from renq_site.shared_redis import shared_redis

logger = logging.getLogger(__name__)

OFFER_PREFIX = "renq:head-start:"
# An older offer is dropped: its job's message has reached a worker by then (or never will).
MAX_OFFER_AGE_S = 0.1
# Offers no idle worker took expire; a queue keeps its few newest meanwhile.
OFFER_TTL_MS = 1000
MAX_OFFERS_KEPT = 4


@dataclass(frozen=True)
class Offer:
    job_id: str
    queue: str
    carried: str  # the job's input, JSON, as its message carries it (INPUT_HEADER)
    offered_at: float  # time.time() at the web
    # Its submitter answers whoever takes it (inference.dispatch.handover): the job may be
    # handed over to that worker instead of published. False: an older web process's offer.
    answered: bool = False

    @property
    def age_s(self) -> float:
        return time.time() - self.offered_at


def offer_key(queue: str) -> str:
    return f"{OFFER_PREFIX}{queue}"


def _queue_offer(pipe, queue: str, job_id: str, carried: str) -> None:
    """The offer's commands, on a pipeline (redis-py's or its asyncio twin's)."""
    key = offer_key(queue)
    fields = {"job": job_id, "input": carried, "at": time.time(), "answered": True}
    pipe.lpush(key, json.dumps(fields))
    pipe.ltrim(key, 0, MAX_OFFERS_KEPT - 1)
    pipe.pexpire(key, OFFER_TTL_MS)


def offer_head_start(job: Job) -> bool:
    """Offer a realtime job bound for a GPU worker to an idle one, in one Redis round trip,
    before its commit. Returns whether it was offered: its submit then answers the offer's
    taker (`head_start_offered`), as a front door's. Best effort: a Redis error loses only
    the head start."""
    carried = carried_input(job)
    if carried is None:
        return False
    target = destination(job)
    if target.task != RUN_JOB_TASK:
        return False  # a cloud call has no forward pass to start
    pipe = shared_redis().pipeline(transaction=False)
    _queue_offer(pipe, target.queue, str(job.pk), carried)
    try:
        pipe.execute()
    except redis.RedisError:
        logger.debug("head start not offered for job %s", job.pk, exc_info=True)
        return False
    return True


def take_offer(client: redis.Redis, queues: Sequence[str], timeout_s: int) -> Offer | None:
    """The oldest offer for one of `queues`, waiting up to `timeout_s` for one (None: none
    came). Raises what Redis raises."""
    popped = client.brpop([offer_key(queue) for queue in queues], timeout=timeout_s)
    if popped is None:
        return None
    key, value = popped
    try:
        fields = json.loads(value)
        return Offer(
            job_id=str(fields["job"]),
            queue=key.decode()[len(OFFER_PREFIX) :],
            carried=str(fields["input"]),
            offered_at=float(fields["at"]),
            answered=bool(fields.get("answered", False)),
        )
    except (ValueError, KeyError, TypeError):
        logger.warning("unreadable head-start offer on %s", key)
        return None


# Offers on their way (asyncio keeps only weak references to tasks).
_offering: set[asyncio.Task] = set()


def offer_in_background(
    client: redis.asyncio.Redis, queue: str, job_id: str, carried: str
) -> None:
    """The same offer from a front door's event loop, for a job whose queue and input it knows
    before its submission runs (the hop to a database thread or request lane, authentication
    and admission then overlap the pass too): a task of the running loop, held until it ends.
    The submit must say so (`head_start_offered`): it answers the offer's taker. Best effort,
    as offer_head_start."""
    task = asyncio.ensure_future(_offer(client, queue, job_id, carried))
    _offering.add(task)
    task.add_done_callback(_offering.discard)


async def _offer(client: redis.asyncio.Redis, queue: str, job_id: str, carried: str) -> None:
    pipe = client.pipeline(transaction=False)
    _queue_offer(pipe, queue, job_id, carried)
    try:
        await pipe.execute()
    except (redis.RedisError, OSError):
        logger.debug("head start not offered for job %s", job_id, exc_info=True)
