"""Text as the worker generates it, relayed to the web process that streams it to the client.

Worker side (`TextRelay`, called from the LLM engine after each decode step): every new piece
of text is appended, with its sequence number, to a short-lived Redis list and published on
the job's channel. Web side (`generated_text`): subscribe to the channel, then read the list
(pieces published before the subscription are not lost), then yield each new piece as it is
published, until the job is final. The pieces are a preview: the job's stored result is the
record, and the caller sends whatever the pieces missed once the job is final.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import redis

from inference.delivery.waiting import (
    SUBSCRIBE_CONFIRM_TIMEOUT_S,
    Notice,
    async_redis,
    job_channel,
)
from renq_site.shared_redis import shared_redis

logger = logging.getLogger(__name__)

TEXT_CHANNEL_PREFIX = "renq:job-text:"
TEXT_LOG_PREFIX = "renq:job-text-log:"
# How long the pieces stay readable after the last one: a client reconnecting late reads them.
TEXT_LOG_TTL_S = 600


def text_channel(job_id) -> str:
    return f"{TEXT_CHANNEL_PREFIX}{job_id}"


def text_log(job_id) -> str:
    return f"{TEXT_LOG_PREFIX}{job_id}"


class TextRelay:
    """Publishes the pieces of text of one batch's streaming jobs (worker side, model thread).
    Never raises: streaming is a preview, the stored result is what counts."""

    def __init__(
        self,
        job_ids: dict[int, uuid.UUID],
        *,
        sequence: dict[int, int] | None = None,
        first_text_at: dict[int, float] | None = None,
    ):
        self.job_ids = job_ids  # the batch's job index → job id
        # Where earlier passes of a generation that continues in this one left off.
        self.sequence: dict[int, int] = dict(sequence or {})
        self.first_text_at: dict[int, float] = dict(first_text_at or {})

    def __call__(self, job_index: int, text: str) -> None:
        self.first_text_at.setdefault(job_index, time.time())
        seq = self.sequence.get(job_index, 0)
        self.sequence[job_index] = seq + 1
        job_id = self.job_ids[job_index]
        piece = json.dumps({"seq": seq, "text": text})
        try:
            pipe = shared_redis().pipeline(transaction=False)
            pipe.rpush(text_log(job_id), piece)
            pipe.expire(text_log(job_id), TEXT_LOG_TTL_S)
            pipe.publish(text_channel(job_id), piece)
            pipe.execute()
        except redis.RedisError:
            logger.warning("could not relay generated text of job %s", job_id, exc_info=True)


async def generated_text(
    job_id,
    is_final: Callable[[], Awaitable[bool]],
    *,
    timeout_s: float,
) -> AsyncIterator[str]:
    """The job's text, piece by piece, as generated; ends when the job is final (or at
    `timeout_s`). `is_final()` reads the job's status."""
    deadline = time.monotonic() + timeout_s
    pubsub = async_redis().pubsub()
    next_seq = 0
    try:
        await pubsub.subscribe(text_channel(job_id), job_channel(job_id))
        for _ in range(2):  # one confirmation per channel
            await pubsub.get_message(timeout=SUBSCRIBE_CONFIRM_TIMEOUT_S)
        for raw in await async_redis().lrange(text_log(job_id), 0, -1):
            piece = json.loads(raw)
            if piece["seq"] == next_seq:
                next_seq += 1
                yield piece["text"]
        if await is_final():
            return
        while (left_s := deadline - time.monotonic()) > 0:
            message = await pubsub.get_message(
                ignore_subscribe_messages=True, timeout=min(left_s, 1.0)
            )
            if message is None:
                if await is_final():  # a lost notification costs at most a second
                    return
                continue
            channel = message["channel"].decode()
            if channel == job_channel(job_id):
                notice = Notice.decode(message["data"])
                if notice is None or notice.stored:
                    return
                continue  # its answer before the store: the row the caller reads comes next
            piece = json.loads(message["data"])
            if piece["seq"] == next_seq:
                next_seq += 1
                yield piece["text"]
    except (TimeoutError, redis.RedisError, OSError):
        logger.warning("text stream of job %s broke; the final result follows", job_id)
    finally:
        try:
            await pubsub.aclose()
        except (redis.RedisError, OSError):
            pass
