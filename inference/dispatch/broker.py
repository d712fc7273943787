"""What RabbitMQ knows about renq's queues: how many consumers listen and how many messages
wait. Read-only: sending is inference.dispatch.publishing's."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from renq_site.celery import app

logger = logging.getLogger(__name__)

# How long a consumer count read from RabbitMQ is trusted (one round trip per queue).
CONSUMER_COUNT_TTL_S = 1.0

_consumer_counts: dict[tuple[str, ...], tuple[float, int]] = {}


def consumer_count(queue_names: Sequence[str]) -> int:
    """How many consumers RabbitMQ has on these queues. RabbitMQ drops a consumer the moment
    its worker's connection closes (crash, kill, shutdown), so this sees a stopped worker at
    once, where a heartbeat would need a timeout. Cached for CONSUMER_COUNT_TTL_S per process;
    when the broker cannot be asked, workers are assumed present (a broker outage is not a
    dead worker)."""
    key = tuple(queue_names)
    now = time.monotonic()
    cached = _consumer_counts.get(key)
    if cached and cached[0] > now:
        return cached[1]
    total = 0
    try:
        with app.connection_for_read() as connection:
            for name in queue_names:
                channel = connection.channel()
                try:
                    total += channel.queue_declare(queue=name, passive=True).consumer_count
                except connection.channel_errors:
                    pass  # never declared: nobody consumes it (the 404 closed the channel)
                finally:
                    try:
                        channel.close()
                    except Exception:  # noqa: BLE001 - a channel the 404 already closed
                        pass
    except Exception:  # noqa: BLE001 - broker unreachable: assume workers
        logger.warning("could not read consumer counts for %s", queue_names, exc_info=True)
        return 1
    _consumer_counts[key] = (now + CONSUMER_COUNT_TTL_S, total)
    return total


def ready_message_counts(queue_names: Sequence[str]) -> dict[str, int]:
    """Messages waiting (not delivered) in each queue, as RabbitMQ counts them; a queue that
    was never declared counts 0. Raises when the broker cannot be asked."""
    counts: dict[str, int] = {}
    with app.connection_for_read() as connection:
        for name in queue_names:
            channel = connection.channel()
            try:
                counts[name] = channel.queue_declare(queue=name, passive=True).message_count
            except connection.channel_errors:
                counts[name] = 0
            finally:
                try:
                    channel.close()
                except Exception:  # noqa: BLE001 - a channel the 404 already closed
                    pass
    return counts


def forget_consumer_counts() -> None:
    _consumer_counts.clear()
