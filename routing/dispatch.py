"""Publishing a routed job to its backend's queue: local → the service's tier queue (the GPU
workers), cloud → the I/O queue of its tier, consumed by thread-pool workers."""

from __future__ import annotations

import logging
import uuid

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from inference.dispatch import publish_job
from inference.models import Job
from inference.tiers import TIER_ORDER, Tier
from renq_site.celery import app
from routing.models import Backend, JobRoute
from routing.router import Router, RoutingDecision

logger = logging.getLogger(__name__)

CALL_BACKEND_TASK = "routing.call_backend"


def io_queue_name(tier: str) -> str:
    return f"{settings.RENQ_QUEUE_PREFIX}io.{Tier(tier).value}"


def io_queue_names() -> list[str]:
    return [io_queue_name(tier) for tier in TIER_ORDER]


def publish_to_backend(
    job_id: uuid.UUID, backend: Backend, service_name: str, tier: str, message_priority: int
) -> bool:
    """Publish one message for the job to `backend`. False when the broker refused: the job
    stays unpublished and the outbox sweep sends it (to the local queue) later."""
    if backend.is_local:
        return publish_job(job_id, service_name, tier, message_priority)
    try:
        app.send_task(
            CALL_BACKEND_TASK,
            args=[str(job_id), backend.pk],
            queue=io_queue_name(tier),
            priority=message_priority,
            task_id=str(uuid.uuid4()),
        )
    except Exception:  # noqa: BLE001 - any broker failure leaves the job for the sweeper
        logger.exception("publishing job %s to %s failed", job_id, backend.name)
        return False
    Job.objects.filter(id=job_id, published_at__isnull=True).update(published_at=timezone.now())
    return True


def publish_to_backend_on_commit(job: Job, backend: Backend) -> None:
    service_name, tier, priority = job.service.name, job.tier, job.message_priority
    transaction.on_commit(lambda: publish_to_backend(job.id, backend, service_name, tier, priority))


def record_decision(job: Job, decision: RoutingDecision) -> JobRoute:
    route, _ = JobRoute.objects.update_or_create(
        job=job,
        defaults={
            "backend": decision.backend,
            "reason": decision.reason[:4000],
            "predicted_local_wait_s": decision.predicted_local_wait_s,
            "scores": decision.scores,
        },
    )
    return route


def route_job_on_commit(job: Job, router: Router | None = None) -> bool:
    """Choose the job's backend, record why, and publish there after commit. Returns False
    (doing nothing) when the job's service has no route: the caller publishes as before."""
    decision = (router or Router()).choose(job)
    if decision is None or decision.backend is None:
        return False
    job.route = record_decision(job, decision)  # cached on the job: the 202 shows it
    publish_to_backend_on_commit(job, decision.backend)
    return True
