"""Publishing job messages to the tier queues, always after the job's row is committed."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable

from django.db import transaction
from django.utils import timezone

from inference.models import Job, JobStatus
from inference.tiers import queue_name
from renq_site.celery import app

logger = logging.getLogger(__name__)

RUN_JOB_TASK = "inference.run_job"


def publish_job(job_id: uuid.UUID, service_name: str, tier: str, message_priority: int) -> bool:
    """Publish one dispatch message and record when RabbitMQ confirmed it.

    Returns False when the broker refused or was unreachable: the job stays queued with no
    published_at, and `republish_unpublished` sends it later, so an accepted job is never lost.
    """
    try:
        app.send_task(
            RUN_JOB_TASK,
            args=[str(job_id)],
            queue=queue_name(service_name, tier),
            priority=message_priority,
            # Each publish gets its own id; Postgres, not the message id, makes runs unique.
            task_id=str(uuid.uuid4()),
        )
    except Exception:  # noqa: BLE001 - any broker failure leaves the job for the sweeper
        logger.exception("publishing job %s failed; the sweeper will retry", job_id)
        return False
    Job.objects.filter(id=job_id, published_at__isnull=True).update(published_at=timezone.now())
    return True


def publish_on_commit(job: Job) -> None:
    """Publish once the surrounding transaction commits, so a worker never sees a job that
    does not exist yet (or never will, if the transaction rolls back)."""
    transaction.on_commit(
        lambda: publish_job(job.id, job.service.name, job.tier, job.message_priority)
    )


def republish_unpublished(older_than_s: float = 10.0) -> int:
    """The outbox sweep: publish queued jobs whose publish never got confirmed."""
    cutoff = timezone.now() - timezone.timedelta(seconds=older_than_s)
    stale: Iterable[Job] = Job.objects.filter(
        status=JobStatus.QUEUED, published_at__isnull=True, created_at__lt=cutoff
    ).select_related("service")[:1000]
    return sum(
        publish_job(job.id, job.service.name, job.tier, job.message_priority) for job in stale
    )
