"""Pulls dispatch messages from one service's tier queues, highest tier first, with aging.

Why the worker pulls instead of letting Celery deliver: RabbitMQ applies prefetch per
consumer, so a worker consuming four tier queues holds one message per queue and Celery runs
them in arrival order, not tier order. The batch runner therefore takes the rest of each batch
itself with basic.get, choosing the tier. Messages stay unacked until their jobs' outcomes are
stored, so a crash hands them back to RabbitMQ.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from amqp.exceptions import AMQPError
from kombu import Connection
from kombu.exceptions import KombuError
from kombu.message import Message

from inference.queues import tier_queue
from inference.tiers import AGING_INTERVAL_S, TIER_ORDER, Tier

logger = logging.getLogger(__name__)

# What a broken broker connection or channel raises through kombu/py-amqp ("connection already
# closed", BrokenPipeError, ConnectionResetError, channel closed by the broker, …).
BROKER_ERRORS: tuple[type[BaseException], ...] = (OSError, KombuError, AMQPError)


@dataclass
class PulledMessage:
    job_id: str
    tier: Tier
    message: Message

    @property
    def redelivered(self) -> bool:
        return bool(self.message.delivery_info.get("redelivered"))


class TierQueueReader:
    """One per worker process and service; keeps its own broker channel."""

    def __init__(
        self,
        connection: Connection,
        service_name: str,
        *,
        queue_factory: Callable[[str], object],
        clock: Callable[[], float] = time.monotonic,
    ):
        self.service_name = service_name
        self.clock = clock
        self._connection = connection
        self._channel = connection.channel()
        self._queues = {}
        for tier in TIER_ORDER:
            queue = queue_factory(tier_queue(service_name, tier))(self._channel)
            # Same arguments as the worker's -Q declaration, so this never 406s.
            queue.declare()
            self._queues[tier] = queue
        now = clock()
        self._last_served = {tier: now for tier in TIER_ORDER}

    def tier_order(self) -> list[Tier]:
        """Tiers in the order to try now: tiers unserved past their aging interval first, the
        most overdue (in seconds past its interval) first; then strict priority.

        Overdue is measured in absolute seconds, so a busy tier that is served every batch is
        overdue by at most one batch's duration, while a starved tier's lateness keeps growing:
        no tier waits much longer than its interval plus one batch.
        """
        now = self.clock()
        lateness = {
            tier: now - self._last_served[tier] - AGING_INTERVAL_S[tier]
            for tier in TIER_ORDER
            if AGING_INTERVAL_S[tier]
        }
        overdue = sorted((t for t, late in lateness.items() if late > 0), key=lateness.get)
        overdue.reverse()
        return overdue + [tier for tier in TIER_ORDER if tier not in overdue]

    def mark_served(self, tier: str) -> None:
        self._last_served[Tier(tier)] = self.clock()

    def get(self, tiers: list[Tier] | None = None) -> PulledMessage | None:
        """The next message by tier order, or None when every tier queue is empty."""
        for tier in tiers if tiers is not None else self.tier_order():
            message = self._queues[tier].get(no_ack=False, accept=["json"])
            if message is None:
                # Nothing waiting is nothing starving: restart this tier's aging clock.
                self._last_served[tier] = self.clock()
                continue
            self._last_served[tier] = self.clock()
            args = message.decode()[0]
            return PulledMessage(job_id=str(args[0]), tier=tier, message=message)
        return None

    def close(self) -> None:
        try:
            self._channel.close()
        finally:
            self._connection.release()


class ReaderPool:
    """The worker process's readers, one per service, each on its own broker connection.

    A reader whose connection broke is discarded and the next batch opens a new one, so a
    worker that lived through a broker outage serves again as soon as the broker is back
    (a cached reader that never reconnected kept failing every later batch).
    """

    def __init__(
        self,
        connect: Callable[[], Connection],
        queue_factory: Callable[[str], object],
    ):
        self._connect = connect
        self._queue_factory = queue_factory
        self._readers: dict[str, TierQueueReader] = {}

    def get(self, service_name: str) -> TierQueueReader | None:
        """The service's reader, or None while the broker cannot be reached."""
        reader = self._readers.get(service_name)
        if reader is None:
            try:
                reader = TierQueueReader(
                    self._connect(), service_name, queue_factory=self._queue_factory
                )
            except BROKER_ERRORS:
                logger.warning(
                    "cannot open a reader for %s; batching the seed alone",
                    service_name,
                    exc_info=True,
                )
                return None
            self._readers[service_name] = reader
        return reader

    def discard(self, service_name: str) -> None:
        reader = self._readers.pop(service_name, None)
        if reader is not None:
            try:
                reader.close()
            except BROKER_ERRORS:
                pass  # already broken: closing is only tidying up

    def close_all(self) -> None:
        for name in list(self._readers):
            self.discard(name)
