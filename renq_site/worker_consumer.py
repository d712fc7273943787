"""The workers' consumer: Celery's, back at work within a second of a broker that is back.

Celery's consumer retries a lost broker connection after 2, 4, 6… s (kombu's defaults, which
`broker_connection_retry` cannot change): a RabbitMQ restart of a few seconds left the GPU
worker away for seconds more while realtime and api jobs, which promise a start within
seconds, expired in its queues. A retry every RECONNECT_MAX_S at most costs the broker one
failed connection attempt per worker and second while it is away.

Without Mingle: at start and after every reconnect it asks the other workers for the task ids
they revoked and waits a second for their answers. renq revokes no tasks (a cancelled job is
cancelled in Postgres, and its claim finds it so).
"""

from __future__ import annotations

from functools import partial

from celery.worker.consumer import Consumer
from kombu import Connection

RECONNECT_FIRST_S = 0.2
RECONNECT_STEP_S = 0.4
RECONNECT_MAX_S = 1.0


class PromptConsumer(Consumer):
    def __init__(self, *args, worker_options: dict | None = None, **kwargs):
        # As `celery worker --without-mingle` (the Tasks step requires Mingle: it stays, idle).
        options = {**(worker_options or {}), "without_mingle": True}
        super().__init__(*args, worker_options=options, **kwargs)

    def ensure_connected(self, conn: Connection) -> Connection:
        # Celery passes no intervals to kombu's ensure_connection: give it ours.
        conn.ensure_connection = partial(
            conn.ensure_connection,
            interval_start=RECONNECT_FIRST_S,
            interval_step=RECONNECT_STEP_S,
            interval_max=RECONNECT_MAX_S,
        )
        return super().ensure_connected(conn)
