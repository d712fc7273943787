"""Celery tasks: thin wrappers over the workers (inference.workers).

| task                     | queue                          | process    |
|--------------------------|--------------------------------|------------|
| inference.run_job        | <service>.<tier>               | GPU worker |
| inference.call_backend   | io.<tier>                      | I/O worker |
| inference.sweep          | renq.control (beat)            | control    |
"""

from __future__ import annotations

import logging
import time

import redis
from celery import shared_task
from celery.exceptions import Reject
from celery.signals import (
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
)
from django.db import DatabaseError, InterfaceError, close_old_connections, connections

from inference.config.tiers import tier_policies
from inference.dispatch import fair_share
from inference.dispatch.publishing import INPUT_HEADER
from inference.jobs.tiers import TIER_NAMES, Tier
from inference.workers.cloud import run_cloud_attempt
from inference.workers.cpu_pinning import keep_off_model_cores, raise_model_priority
from inference.workers.gpu.runner import BatchRunner
from inference.workers.io_turns import IoTurns
from inference.workers.readiness import forget_process_readiness, mark_process_ready
from inference.workers.sweeper import (
    expire_overdue,
    promote_waiting_jobs,
    sweep_jobs,
    take_over_lapsed_leases,
)
from inference.workers.tier_reader import BROKER_ERRORS, ReaderPool, message_job_ids
from inference.workers.warmup import (
    consumed_realtime_queues,
    consumed_service_names,
    import_consumed_engines,
    torch_threads,
    warm_engines_for_consumed_queues,
)
from renq_site.celery import app
from renq_site.db_sessions import close_old_connections_checked_once_a_second
from renq_site.garbage_collection import freeze_startup_objects

logger = logging.getLogger(__name__)

# Postgres, Redis or the broker failing before a job's outcome is stored. The message must not
# be acked into oblivion (Celery acks a failed acks_late task): it goes back to its queue after
# a pause, so the job runs once the dependency is back.
INFRASTRUCTURE_ERRORS: tuple[type[BaseException], ...] = (
    DatabaseError,
    InterfaceError,  # a connection the outage closed (not a DatabaseError)
    redis.ConnectionError,
    redis.TimeoutError,
    *BROKER_ERRORS,
)
# Pause before handing the message back, so an outage is not a hot redelivery loop.
INFRASTRUCTURE_BACKOFF_S = 1.0


def _tier_weights() -> dict[str, float]:
    """config.yaml `tiers:` weights, read when a reader (re)opens and after a config change."""
    return {tier: policy.weight for tier, policy in tier_policies().items()}


_readers = ReaderPool(
    app.connection_for_read, lambda name: app.amqp.queues[name], weights=_tier_weights
)
_runner = BatchRunner(_readers, served=consumed_service_names)
# The I/O worker's cloud calls in tier order: each thread pulls from the io.<tier> queues.
_io_turns = IoTurns(
    app.connection_for_read, lambda name: app.amqp.queues[name], weights=_tier_weights
)


def _requeue_after_outage(exc: BaseException) -> Reject:
    logger.warning("dependency unavailable (%s); message goes back to its queue", exc)
    close_old_connections()  # a broken database connection is reopened by the next task
    time.sleep(INFRASTRUCTURE_BACKOFF_S)
    return Reject(str(exc), requeue=True)


@shared_task(name="inference.run_job", bind=True)
def run_job(self, job_id: str | list[str]) -> dict:
    info = self.request.delivery_info or {}
    tier = (info.get("routing_key") or "").rsplit(".", 1)[-1]
    start_tag = getattr(self.request, fair_share.START_TAG_HEADER, None)
    try:
        report = _runner.run(
            message_job_ids(job_id),
            seed_redelivered=bool(info.get("redelivered")),
            seed_tier=tier if tier in TIER_NAMES else None,
            seed_taken={info["routing_key"]: float(start_tag)}
            if start_tag is not None and info.get("routing_key")
            else None,
            seed_queue=info.get("routing_key"),
            seed_input=getattr(self.request, INPUT_HEADER, None),
        )
    except INFRASTRUCTURE_ERRORS as exc:
        raise _requeue_after_outage(exc) from exc
    return report


@shared_task(name="inference.call_backend", bind=True)
def call_backend(self, job_id: str, backend_id: int) -> dict:
    info = self.request.delivery_info or {}
    routing_key = info.get("routing_key") or ""
    tier = routing_key.rsplit(".", 1)[-1]
    start_tag = getattr(self.request, fair_share.START_TAG_HEADER, None)
    if start_tag is not None and routing_key:
        fair_share.advance({routing_key: float(start_tag)})
    try:
        # The messages whose turn comes first are pulled and run before it, more after it.
        return _io_turns.run(
            Tier(tier) if tier in TIER_NAMES else Tier.REALTIME,
            lambda: run_cloud_attempt(
                job_id, backend_id, redelivered=bool(info.get("redelivered"))
            ),
            lambda pulled_id, pulled_backend_id, redelivered: run_cloud_attempt(
                pulled_id, pulled_backend_id, redelivered=redelivered
            ),
            requeue_on=INFRASTRUCTURE_ERRORS,
        )
    except INFRASTRUCTURE_ERRORS as exc:
        raise _requeue_after_outage(exc) from exc


@shared_task(name="inference.sweep")
def sweep() -> dict:
    return sweep_jobs()


@shared_task(name="inference.take_over")
def take_over() -> int:
    return take_over_lapsed_leases()


@shared_task(name="inference.expire")
def expire() -> int:
    return expire_overdue()


@shared_task(name="inference.promote")
def promote() -> int:
    return promote_waiting_jobs()


@task_prerun.connect
def _close_unusable_or_old_connections(**_kwargs) -> None:
    """A task is a request boundary: a Postgres session past CONN_MAX_AGE or broken (e.g. by
    a database restart) is closed and the task opens a fresh one; others are reused."""
    close_old_connections_checked_once_a_second()


@worker_init.connect
def _import_engines(**_kwargs) -> None:
    import_consumed_engines()


@worker_process_init.connect
def _warm_worker_process(**_kwargs) -> None:
    forget_process_readiness()  # not warm until this warm-up says so
    keep_off_model_cores()  # before this process starts its threads (they inherit it)
    if consumed_service_names():
        raise_model_priority(torch_threads())  # likewise; control and I/O workers run no model
    failed = warm_engines_for_consumed_queues()
    # Celery's Django fixup runs after this receiver: it closes this thread's Postgres
    # sessions by file descriptor, then again through the driver, and a thread started here
    # may have opened a socket or file on that number in between. Closed first, it skips them.
    connections.close_all()
    _runner.head_starts.listen(consumed_realtime_queues())
    # The engines loaded above live as long as the process.
    freeze_startup_objects()
    # Last: the readiness probe calls the process warm once it can serve at once, after the
    # collection above has walked everything the models loaded.
    mark_process_ready(failed=failed)


@worker_process_shutdown.connect
def _close_readers(**_kwargs) -> None:
    _readers.close_all()


@worker_process_shutdown.connect
def _forget_readiness(**_kwargs) -> None:
    forget_process_readiness()
