"""Pulls dispatch messages from one service's tier queues: realtime first, then the other
tiers by weighted share.

Why the worker pulls instead of letting Celery deliver: RabbitMQ applies prefetch per
consumer, so a worker consuming four tier queues holds one message per queue and Celery runs
them in arrival order, not tier order. The batch runner therefore takes the rest of each batch
itself with basic.get, choosing the tier. Messages stay unacked until their jobs' outcomes are
stored, so a crash hands them back to RabbitMQ. Aging is not done here but by the control
worker's `inference.promote` task, for every worker at once: a job waiting past its tier's
threshold is re-published one tier up (inference.workers.sweeper.promote_waiting_jobs).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from amqp.exceptions import AMQPError
from django.db import Error as DjangoDatabaseError
from kombu import Connection
from kombu.exceptions import KombuError
from kombu.message import Message

from inference.config.changes import ConfigWatcher
from inference.dispatch.fair_share import FRESH_HEADER, START_TAG_HEADER
from inference.dispatch.queues import tier_queue
from inference.jobs.tiers import TIER_ORDER, Tier

logger = logging.getLogger(__name__)

# What a broken broker connection or channel raises through kombu/py-amqp ("connection already
# closed", BrokenPipeError, ConnectionResetError, channel closed by the broker, …).
BROKER_ERRORS: tuple[type[BaseException], ...] = (OSError, KombuError, AMQPError)


# P1:P2:P3 when all three have work (P0 is strict: always first).
DEFAULT_WEIGHTS: dict[str, float] = {Tier.API: 5.0, Tier.BATCH: 3.0, Tier.OFFLINE: 2.0}


class WeightedShare:
    """Weighted share between the tiers below realtime, counted in jobs claimed: start-time
    fair queuing (Goyal et al., SFQ) over the tier queues.

    Each tier has a virtual finish tag; taking n jobs from a tier starts at max(its tag, the
    virtual time) and moves its tag n / weight further. The tier with the smallest start tag
    goes first. A tier whose queue was empty starts at the virtual time when work returns:
    it banks no credit for the quiet spell and pays no debt for the others' work, so the
    share holds from the first jobs after any tier joins (a count-based reset let a tier that
    ran alone run ahead, then sit out once the others had work).

    Jobs, not messages: a message may carry several jobs, or none that can still run (expired
    or cancelled while queued); a tier whose queue head is dead messages would otherwise spend
    its share on them and starve. With weights 5:3:2 every non-empty tier is taken at least
    once in every 10 jobs.
    """

    MIN_WEIGHT = 1e-6  # a tier weighted 0 still runs when it is the only one with work
    TIERS: tuple[Tier, ...] = tuple(t for t in TIER_ORDER if t != Tier.REALTIME)

    def __init__(self, weights: dict[str, float]):
        self.reweight(weights)
        self.finish_tags = {t: 0.0 for t in self.TIERS}
        self.virtual_time = 0.0

    def reweight(self, weights: dict[str, float]) -> None:
        """New weights from now on (tags already moved stay where they are)."""
        self.weights = {t: max(self.MIN_WEIGHT, float(weights.get(t, 0.0))) for t in self.TIERS}

    def _start_tag(self, tier: Tier) -> float:
        return max(self.finish_tags[tier], self.virtual_time)

    def order(self) -> list[Tier]:
        return sorted(self.finish_tags, key=lambda t: (self._start_tag(t), t.rank))

    def served(self, tier: Tier, jobs: int = 1) -> None:
        """`jobs` of the tier's jobs were taken (one message's, or one seed's)."""
        if tier in self.finish_tags:
            start = self._start_tag(tier)
            self.virtual_time = start
            self.finish_tags[tier] = start + jobs / self.weights[tier]

    def corrected(self, tier: Tier, jobs: int) -> None:
        """The last count for the tier was off by `jobs` (negative: fewer were claimed)."""
        if tier in self.finish_tags:
            self.finish_tags[tier] += jobs / self.weights[tier]


def message_job_ids(first_arg) -> list[str]:
    """A dispatch message carries one job id, or a list of them (jobs submitted together)."""
    if isinstance(first_arg, list):
        return [str(job_id) for job_id in first_arg]
    return [str(first_arg)]


@dataclass
class PulledMessage:
    job_ids: list[str]
    tier: Tier
    message: Message

    @property
    def redelivered(self) -> bool:
        return bool(self.message.delivery_info.get("redelivered"))

    @property
    def start_tag(self) -> float | None:
        """Its start tag in its queue's fair share (None: it went out without one)."""
        start = (self.message.headers or {}).get(START_TAG_HEADER)
        return None if start is None else float(start)

    @property
    def fresh(self) -> bool:
        """Its tenant had no work ahead of the queue's virtual time when it went out."""
        return bool((self.message.headers or {}).get(FRESH_HEADER))

    @property
    def left_in_queue(self) -> int | None:
        """Messages its queue still held when this one was taken (basic.get-ok's count)."""
        return self.message.delivery_info.get("message_count")


class TierQueueReader:
    """One per worker process and service; keeps its own broker channel."""

    # The pool's look for new weights, before each pull: a drain pulls for many seconds
    # between two tasks. None: the weights stay as given.
    _before_pull: Callable[[], None] | None = None

    def __init__(
        self,
        connection: Connection,
        service_name: str,
        *,
        queue_factory: Callable[[str], object],
        weights: dict[str, float] | None = None,
        before_pull: Callable[[], None] | None = None,
    ):
        self.service_name = service_name
        self._before_pull = before_pull
        self._connection = connection
        self._channel = connection.channel()
        self._queues = {}
        for tier in TIER_ORDER:
            queue = queue_factory(tier_queue(service_name, tier))(self._channel)
            # Same arguments as the worker's -Q declaration, so this never 406s.
            queue.declare()
            self._queues[tier] = queue
        self.share = WeightedShare(weights or DEFAULT_WEIGHTS)

    def tier_order(self) -> list[Tier]:
        """Realtime first, always; then the other tiers by how far behind their share."""
        return [Tier.REALTIME, *self.share.order()]

    def get(self, tiers: list[Tier] | None = None, *, charge: bool = True) -> PulledMessage | None:
        """The next message by tier order, or None when every tier queue is empty. Its jobs
        count toward its tier's share until the caller reports how many it claimed (not when
        `charge` is off: the caller only looks, and charges what it keeps)."""
        if self._before_pull is not None:
            self._before_pull()
        for tier in tiers if tiers is not None else self.tier_order():
            message = self._queues[tier].get(no_ack=False, accept=["json"])
            if message is None:
                continue
            pulled = PulledMessage(message_job_ids(message.decode()[0][0]), tier, message)
            if charge:
                # Provisional, so several messages pulled before one claim follow the share too.
                self.charge(pulled)
            return pulled
        return None

    def waiting(self, tier: Tier) -> int:
        """Messages ready in the tier's queue (a passive declare: one round trip)."""
        return self._queues[tier].queue_declare(passive=True).message_count

    def charge(self, pulled: PulledMessage) -> None:
        """The pulled message's jobs count toward its tier's share."""
        self.share.served(pulled.tier, len(pulled.job_ids))

    def claimed(self, pulled: PulledMessage, jobs: int) -> None:
        """`jobs` of the pulled message's jobs were claimed to run (0: none could run)."""
        self.share.corrected(pulled.tier, jobs - len(pulled.job_ids))

    def close(self) -> None:
        try:
            self._channel.close()
        finally:
            self._connection.release()


class ReaderPool:
    """The worker process's readers, one per service, each on its own broker connection.

    A reader whose connection broke is discarded and the next batch opens a new one, so a
    worker that lived through a broker outage serves again as soon as the broker is back.

    `weights()` is read when a reader opens and again, for every open reader, once the
    configuration change marker moved: the pool looks at it before a reader is handed out and
    before each pull, no more often than `weights_recheck_s` (default RENQ_CONFIG_RECHECK_S),
    so new `tiers:` weights apply to a running reader without a restart.
    """

    def __init__(
        self,
        connect: Callable[[], Connection],
        queue_factory: Callable[[str], object],
        weights: Callable[[], dict[str, float]] = lambda: DEFAULT_WEIGHTS,
        *,
        weights_recheck_s: float | None = None,
    ):
        self._connect = connect
        self._queue_factory = queue_factory
        self._weights = weights
        self._readers: dict[str, TierQueueReader] = {}
        self._config = ConfigWatcher(min_interval_s=weights_recheck_s)
        self._weights_stale = False

    def _reweight_on_config_change(self) -> None:
        try:
            if self._config.changed():
                self._weights_stale = True
            if not self._weights_stale:
                return
            weights = self._weights() if self._readers else None
        except DjangoDatabaseError:  # InterfaceError too: a closed connection
            # The readers keep the weights they have until the database answers again.
            logger.warning("cannot re-read the tier weights", exc_info=True)
            return
        self._weights_stale = False
        if weights is not None:
            for reader in self._readers.values():
                reader.share.reweight(weights)

    def get(self, service_name: str) -> TierQueueReader | None:
        """The service's reader, or None while the broker cannot be reached."""
        # Before a reader opens too: the first look at the marker comes before its weights.
        self._reweight_on_config_change()
        reader = self._readers.get(service_name)
        if reader is None:
            try:
                reader = TierQueueReader(
                    self._connect(),
                    service_name,
                    queue_factory=self._queue_factory,
                    weights=self._weights(),
                    before_pull=self._reweight_on_config_change,
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
