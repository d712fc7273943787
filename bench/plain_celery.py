"""Plain Celery for the fast-path bench's baseline: an app with Celery's defaults and none of
renq's settings (no publish confirms, early acks, a prefetch of four, no priority queues), the
machine's RabbitMQ as its broker, its results in Redis, and a no-op task.

    celery -A bench.plain_celery worker -Q <queue> --concurrency 1
"""

from __future__ import annotations

import os

from celery import Celery

app = Celery(
    "plain",
    broker=os.environ.get("CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//"),
    backend=os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/0"),
)


@app.task(name="bench.plain_noop")
def plain_noop(i: int) -> int:
    """Plain Celery's own cost: a task that does nothing, its result stored in Redis."""
    return i
