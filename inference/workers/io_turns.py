"""The I/O worker's cloud calls in tier order: realtime first, then the tiers below it by the
weighted share, then, inside a tier, the tenants' order (the message priority).

Why the I/O worker pulls instead of letting Celery deliver: RabbitMQ hands a consumer of the
four io.<tier> queues their messages in turn, so Celery alone runs cloud calls round robin
across the tiers whatever their tier, and a larger prefetch only orders what is already in
hand. As the GPU worker does (inference.workers.tier_reader), a thread given a message by
Celery (its seed) first pulls (basic.get) and runs the messages of the tiers whose turn comes
before the seed's, then runs the seed, then goes on pulling in tier order until the queues
are empty or IO_DRAIN_LIMIT_S has passed. The share is the process's, over all its threads.
A pulled message is acked once its attempt is settled; one its thread could not run goes back
to its queue.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from inference.config.changes import ConfigWatcher
from inference.dispatch import fair_share
from inference.dispatch.queues import IO_QUEUE_PREFIX, io_queue
from inference.jobs.tiers import Tier
from inference.workers.tier_reader import (
    BROKER_ERRORS,
    DEFAULT_WEIGHTS,
    PulledMessage,
    TierQueueReader,
    WeightedShare,
)

logger = logging.getLogger(__name__)

# One seed's thread keeps pulling for at most this long (its seed stays unacked meanwhile):
# far below the task limit and RabbitMQ's consumer_timeout. Once the queues are empty it
# returns at once, and Celery's delivery wakes a thread for the next message.
IO_DRAIN_LIMIT_S = 20.0

# (job id, backend id, redelivered) -> the attempt's report.
RunAttempt = Callable[[str, int, bool], dict]


class IoTurns:
    """One per I/O worker process: a reader (its own broker connection) per thread, and one
    weighted share between the tiers for all of them."""

    def __init__(
        self,
        connect: Callable,
        queue_factory: Callable[[str], object],
        weights: Callable[[], dict[str, float]] = lambda: DEFAULT_WEIGHTS,
    ):
        self._connect = connect
        self._queue_factory = queue_factory
        self._weights = weights
        self._share: WeightedShare | None = None
        self._config = ConfigWatcher()
        self._lock = threading.Lock()
        self._local = threading.local()

    def share(self) -> WeightedShare:
        """The process's share; new `tiers:` weights apply once the configuration changed."""
        with self._lock:
            if self._share is None:
                self._share = WeightedShare(self._weights())
            elif self._config.changed():
                self._share.reweight(self._weights())
            return self._share

    def run(
        self,
        seed_tier: Tier,
        run_seed: Callable[[], dict],
        run_pulled: RunAttempt,
        *,
        requeue_on: tuple[type[BaseException], ...] = (),
    ) -> dict:
        """The seed at its tier's turn, the messages pulled before and after it around it.
        `requeue_on`: errors for which a pulled message goes back to its queue (and the
        error is raised, for the seed's task to hand its own message back too)."""
        share = self.share()
        until = time.monotonic() + IO_DRAIN_LIMIT_S
        result: dict | None = None
        while True:
            if result is None:
                tiers = self._ahead_of(share, seed_tier)
            elif time.monotonic() < until:
                tiers = [Tier.REALTIME, *share.order()]
            else:
                return result
            pulled = self._pull(tiers) if tiers else None
            if pulled is not None:
                self._run_pulled(pulled, run_pulled, requeue_on)
                continue
            if result is not None:
                return result
            share.served(seed_tier, 1)
            result = run_seed()

    @staticmethod
    def _ahead_of(share: WeightedShare, seed_tier: Tier) -> list[Tier]:
        """Realtime, then the tiers whose turn comes before the seed's (none for realtime)."""
        if seed_tier == Tier.REALTIME:
            return []
        ahead = [Tier.REALTIME]
        for tier in share.order():
            if tier == seed_tier:
                break
            ahead.append(tier)
        return ahead

    def _reader(self) -> TierQueueReader | None:
        reader = getattr(self._local, "reader", None)
        if reader is None:
            try:
                # tier_queue(IO_QUEUE_PREFIX, tier) is io_queue(tier).
                reader = TierQueueReader(
                    self._connect(), IO_QUEUE_PREFIX, queue_factory=self._queue_factory
                )
            except BROKER_ERRORS:
                logger.warning("cannot open an io queue reader; running the seed alone")
                return None
            reader.share = self.share()
            self._local.reader = reader
        return reader

    def _discard(self) -> None:
        reader = getattr(self._local, "reader", None)
        self._local.reader = None
        if reader is not None:
            try:
                reader.close()
            except BROKER_ERRORS:
                pass  # already broken: closing is only tidying up

    def _pull(self, tiers: list[Tier]) -> PulledMessage | None:
        reader = self._reader()
        if reader is None:
            return None
        try:
            return reader.get(tiers)
        except BROKER_ERRORS:
            logger.warning("broker connection lost while pulling io messages", exc_info=True)
            self._discard()
            return None

    def _run_pulled(
        self,
        pulled: PulledMessage,
        run_pulled: RunAttempt,
        requeue_on: tuple[type[BaseException], ...],
    ) -> None:
        try:
            args = pulled.message.decode()[0]  # Celery's protocol: (args, kwargs, embed)
            job_id, backend_id = str(args[0]), int(args[1])
        except (ValueError, TypeError, IndexError, KeyError):
            # As Celery does with a message it cannot read: logged and dropped.
            logger.exception("an io message that is not a cloud call: dropped")
            try:
                pulled.message.reject()
            except BROKER_ERRORS:
                self._discard()
            return
        if pulled.start_tag is not None:
            fair_share.advance({io_queue(pulled.tier): pulled.start_tag})
        try:
            run_pulled(job_id, backend_id, pulled.redelivered)
        except requeue_on:
            self._settle(pulled, requeue=True)
            raise
        except Exception:
            # As Celery does with a task that failed: logged and acked, not redelivered.
            logger.exception("cloud attempt of job %s failed", job_id)
        self._settle(pulled, requeue=False)

    def _settle(self, pulled: PulledMessage, *, requeue: bool) -> None:
        try:
            pulled.message.requeue() if requeue else pulled.message.ack()
        except BROKER_ERRORS:
            # The channel is gone: RabbitMQ hands the message back itself.
            self._discard()
