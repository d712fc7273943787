"""The Celery app: reliability settings (late acks, prefetch 1, publisher confirms, a task
limit under RabbitMQ's consumer_timeout), the beat schedule, and the queue topology of
inference.dispatch.queues. Each setting says why beside it."""

import os

from celery import Celery
from celery.signals import worker_init
from django.conf import settings

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "renq_site.settings")

# The queue topology (names, max priority) is defined once, in inference.dispatch.queues; it
# needs only settings, not the app registry, so importing it here is safe before Django is set up.
from inference.dispatch import queues  # noqa: E402
from renq_site import (
    log_format,  # noqa: E402, F401 (RENQ_LOG_FORMAT=json in workers too)
    tracing,  # noqa: E402
)

app = Celery("renq_site")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.update(
    # A message is acked only after the job's outcome is stored; a SIGKILLed/OOM-killed child
    # gives its message back to RabbitMQ instead of losing it (celery#1628).
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    # One unacked message per consumer: anything prefetched is out of RabbitMQ's priority order.
    worker_prefetch_multiplier=1,
    # A pool process loads its models before it reports up (worker_process_init): on a busy
    # host that takes longer than Celery's 4 s, and the parent would kill it over and over.
    worker_proc_alive_timeout=120,
    # Without confirms RabbitMQ may drop publishes silently under memory/disk alarms (celery#5410).
    broker_transport_options={"confirm_publish": True},
    broker_connection_retry_on_startup=True,
    # Queues the worker creates from -Q get the same arguments as the ones we declare on publish;
    # a mismatch would be a 406 PRECONDITION_FAILED.
    task_queue_max_priority=queues.MAX_PRIORITY,
    task_default_priority=0,
    task_default_queue=queues.control_queue(),
    worker_cancel_long_running_tasks_on_connection_loss=True,
    # Back within a second of a broker that is (Celery's own retries wait 2, 4, 6… s).
    worker_consumer="renq_site.worker_consumer:PromptConsumer",
    # After a broker reconnect with tasks in flight, Celery cuts the prefetch count and
    # restores it as those tasks' acks arrive; acks for the lost channel never do, and a
    # control worker (4 threads) stopped taking tasks for good after a broker cut: no sweep,
    # no lease takeover (celery#9512 is the quorum-queue form of it).
    worker_enable_prefetch_count_reduction=False,
    # Hard limit far below RabbitMQ's consumer_timeout (30 min) so the channel is never closed
    # under a running batch (celery#6760).
    task_time_limit=300,
    task_soft_time_limit=240,
    task_ignore_result=True,
    result_expires=3600,
    # Task events (received, started, succeeded) cost every job a publish on the worker's
    # consumer thread. Off unless watched: Flower turns them on in the workers it monitors
    # (its enable_events), `celery control enable_events` too. Never task-sent: Celery would
    # publish it on the publisher's confirm channel, a second confirm per dispatch message.
    worker_send_task_events=False,
    task_send_sent_event=False,
    task_serializer="json",
    accept_content=["json"],
    timezone="UTC",
    # The sweep republishes unconfirmed jobs, recovers claims of dead workers and hands jobs
    # stranded on a local backend with no worker to the next fallback.
    beat_schedule={
        "sweep-jobs": {
            "task": "inference.sweep",
            "schedule": settings.RENQ_SWEEP_INTERVAL_S,
        },
        # Deadlines are enforced while jobs wait, not only when a worker reaches them.
        "expire-overdue": {
            "task": "inference.expire",
            "schedule": settings.RENQ_EXPIRE_INTERVAL_S,
            "options": {"expires": settings.RENQ_EXPIRE_INTERVAL_S * 2},
        },
        # A hung or cut-off worker's claims are taken over as soon as their leases lapse.
        "take-over-lapsed-leases": {
            "task": "inference.take_over",
            "schedule": settings.RENQ_LEASE_CHECK_INTERVAL_S,
            "options": {"expires": settings.RENQ_LEASE_CHECK_INTERVAL_S * 2},
        },
        # Aging across all workers: a job past its tier's threshold is re-published a tier up.
        "promote-waiting": {
            "task": "inference.promote",
            "schedule": settings.RENQ_AGING_INTERVAL_S,
            "options": {"expires": settings.RENQ_AGING_INTERVAL_S * 2},
        },
    },
)
# Celery's Django fixup force-closes every database connection before and after each task
# unless CELERY_DB_REUSE_MAX is set: the GPU worker's tasks are short at idle (one realtime
# job), and a fresh Postgres session (a connect, then a first query on a cold backend) would
# be much of such a job's overhead. Sessions are reused for up to 1,000 tasks; inference.tasks
# closes unusable or obsolete ones (CONN_MAX_AGE, health checks) at each task start, as
# Django does per request.
app.conf["CELERY_DB_REUSE_MAX"] = 1000


@worker_init.connect
def _start_tracing(**_kwargs) -> None:
    """Before the pool starts: prefork children inherit the instrumentation (the SDK restarts
    its export thread in each), thread pools share it."""
    tracing.configure()


# Every installed app's tasks.py: inference's and the Batch API's (inference.batch_api).
app.autodiscover_tasks()
