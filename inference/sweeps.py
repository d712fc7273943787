"""Periodic repairs that keep "nothing accepted is ever lost" true when processes die."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from inference.dispatch import publish_job, republish_unpublished
from inference.models import Job, JobStatus, Service
from inference.tiers import Tier

# A claim older than this (and older than 10 × the service's inference_timeout) is presumed
# dead: its worker died and the message was lost with it (celery#5641 does not requeue a
# message twice).
STALE_CLAIM_FLOOR_S = 120.0


def recover_stale_claims(now=None) -> int:
    now = now or timezone.now()
    recovered = 0
    running = Job.objects.filter(
        status=JobStatus.RUNNING, claimed_at__lt=now - timedelta(seconds=STALE_CLAIM_FLOOR_S)
    ).select_related("service")
    for job in running[:1000]:
        stale_after = max(STALE_CLAIM_FLOOR_S, 10 * job.service.inference_timeout)
        if job.claimed_at > now - timedelta(seconds=stale_after):
            continue
        if job.attempts >= settings.RENQ_MAX_ATTEMPTS:
            Job.objects.filter(pk=job.pk, claim_token=job.claim_token).update(
                status=JobStatus.FAILED,
                finished_at=now,
                error=f"no result after {job.attempts} attempts; the workers running it died",
            )
            continue
        requeued = Job.objects.filter(pk=job.pk, claim_token=job.claim_token).update(
            status=JobStatus.QUEUED, claim_token=None, claimed_at=None, published_at=None
        )
        if requeued:
            publish_job(job.id, job.service.name, job.tier, job.message_priority)
            recovered += 1
    return recovered


def expire_overdue(now=None) -> int:
    """Interactive jobs nobody picked up in time are told so, even with no worker running."""
    now = now or timezone.now()
    expired = 0
    for service in Service.objects.all():
        expired += Job.objects.filter(
            service=service,
            status=JobStatus.QUEUED,
            tier__in=[Tier.REALTIME, Tier.API],
            created_at__lt=now - timedelta(seconds=service.total_timeout),
        ).update(
            status=JobStatus.EXPIRED,
            finished_at=now,
            error="no worker started this job within the service's total_timeout",
        )
    return expired


def sweep_jobs() -> dict:
    # Imported here: routing builds on inference, not the other way round at import time.
    from routing.cascade import rescue_stranded_local_jobs

    return {
        "republished": republish_unpublished(),
        "rescued": rescue_stranded_local_jobs(),
        "recovered": recover_stale_claims(),
        "expired": expire_overdue(),
    }
