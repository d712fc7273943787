"""The messages a run pulled, and when each may be acked.

A message is acked only once every job it carries has its outcome stored; on any error the
unacked messages go back to their queues, and their jobs' claims are taken over on redelivery.
Acks go out on the main thread, on the reader's broker channel.
"""

from __future__ import annotations

import logging

from inference.workers.tier_reader import BROKER_ERRORS, PulledMessage, ReaderPool

logger = logging.getLogger(__name__)


class MessageLedger:
    """Pulled messages and their unfinished jobs: a message is acked when all of them are
    stored, and every unacked one goes back to its queue if the run fails."""

    def __init__(self, readers: ReaderPool | None, service_name: str):
        self._readers = readers
        self._service_name = service_name
        self._waiting: dict[int, tuple[PulledMessage, set[str]]] = {}

    def track(self, pm: PulledMessage, job_ids: set[str]) -> None:
        self._waiting[id(pm)] = (pm, set(job_ids))

    def finished(self, job_ids: set[str]) -> list[PulledMessage]:
        """The messages whose every job is now finished (to ack)."""
        done = []
        for key, (pm, pending) in list(self._waiting.items()):
            pending -= job_ids
            if not pending:
                done.append(pm)
                del self._waiting[key]
        return done

    def unsettled(self) -> list[PulledMessage]:
        unsettled = [pm for pm, _ in self._waiting.values()]
        self._waiting.clear()
        return unsettled

    def ack(self, messages: list[PulledMessage]) -> None:
        """RabbitMQ may forget them: their jobs' outcomes are stored (or none can run)."""
        self._settle(messages, ack=True)

    def requeue(self, messages: list[PulledMessage]) -> None:
        """Back to their queues, to be redelivered (and their claims taken over)."""
        self._settle(messages, ack=False)

    def _settle(self, messages: list[PulledMessage], *, ack: bool) -> None:
        try:
            for pm in messages:
                if not pm.message.acknowledged:
                    pm.message.ack() if ack else pm.message.requeue()
        except BROKER_ERRORS:
            # A dead channel gives its unacked messages back to RabbitMQ by itself; their
            # redelivery finds the jobs finished (or takes the claim over) in Postgres.
            logger.warning("could not settle %d pulled messages", len(messages), exc_info=True)
            self._readers.discard(self._service_name)
