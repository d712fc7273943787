"""Pulls dispatch messages from one service's tier queues, highest tier first, with aging.

Why the worker pulls instead of letting Celery deliver: RabbitMQ applies prefetch per
consumer, so a worker consuming four tier queues holds one message per queue and Celery runs
them in arrival order, not tier order. The batch runner therefore takes the rest of each batch
itself with basic.get, choosing the tier. Messages stay unacked until their jobs' outcomes are
stored, so a crash hands them back to RabbitMQ.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kombu import Connection
from kombu.message import Message

from inference.queues import tier_queue
from inference.tiers import AGING_INTERVAL_S, TIER_ORDER, Tier


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
