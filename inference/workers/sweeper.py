"""Periodic repairs that keep "nothing accepted is ever lost" true when processes die.

Run by the control worker (`celery worker -Q renq.control -B`, every RENQ_SWEEP_INTERVAL_S)
or by hand (`manage.py sweep_jobs`). Each repair is idempotent: the claim makes a duplicate
message harmless, so republishing is always safe.
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from inference import queues
from inference.bulk import finish_stalled_bulks
from inference.models import Job, JobStatus, Service
from inference.placement import hand_on
from inference.publishing import (
    consumer_count,
    destination,
    publish,
    ready_message_counts,
    republish_unpublished,
)
from inference.tiers import Tier
from inference.transitions import Outcome
from routing.attempts import AttemptOutcome, AttemptRecord, record_attempts
from routing.backends.base import LocalEngineError
from routing.cascade import FallbackCascade
from routing.models import Backend, JobRoute

# A claim older than this (and older than 10 × the service's inference_timeout) is presumed
# dead: its worker died and the message was lost with it (celery#5641 does not requeue a
# message twice).
STALE_CLAIM_FLOOR_S = 120.0
# A job queued for a local backend is handed on once no GPU worker has been consuming its
# service's queues and it has waited this long since publishing: a worker restart (model
# load included) should not send a backlog to a paid API.
STRANDED_AFTER_S = 5.0


def recover_stale_claims(now=None) -> int:
    now = now or timezone.now()
    recovered = 0
    running = Job.objects.filter(
        status=JobStatus.RUNNING,
        is_bulk=False,
        claimed_at__lt=now - timedelta(seconds=STALE_CLAIM_FLOOR_S),
    ).select_related("service", "route__backend")
    for job in running[:1000]:
        stale_after = max(STALE_CLAIM_FLOOR_S, 10 * job.service.inference_timeout)
        if job.claimed_at > now - timedelta(seconds=stale_after):
            continue
        held = Job.objects.filter(pk=job.pk, claim_token=job.claim_token)
        if job.attempts >= settings.RENQ_MAX_ATTEMPTS:
            held.fail(f"no result after {job.attempts} attempts; the workers running it died")
            continue
        if held.requeue():
            publish(job)  # where its backend is: the local tier queue or an I/O queue
            recovered += 1
    return recovered


# A queued job whose message was confirmed this long ago, while its queue holds no message at
# all, has lost its message (a worker acked it and then failed before claiming, or a broker
# lost it): it is published again. A duplicate is harmless (the claim runs a job once), so the
# bound is short: a lost message is found within LOST_MESSAGE_AFTER_S + one sweep interval.
LOST_MESSAGE_AFTER_S = 30.0


def republish_lost_messages(now=None, *, lost_after_s: float = LOST_MESSAGE_AFTER_S) -> int:
    now = now or timezone.now()
    waiting = list(
        Job.objects.filter(
            status=JobStatus.QUEUED,
            is_bulk=False,
            published_at__lt=now - timedelta(seconds=lost_after_s),
        ).select_related("service", "route__backend")[:1000]
    )
    if not waiting:
        return 0
    targets = {job.pk: destination(job).queue for job in waiting}
    empty = {q for q, n in ready_message_counts(sorted(set(targets.values()))).items() if n == 0}
    return sum(publish(job) for job in waiting if targets[job.pk] in empty)


def expire_overdue(now=None) -> int:
    """Interactive jobs nobody picked up in time are told so, even with no worker running."""
    now = now or timezone.now()
    expired = 0
    for service in Service.objects.all():
        expired += Job.objects.filter(
            service=service,
            tier__in=[Tier.REALTIME, Tier.API],
            created_at__lt=now - timedelta(seconds=service.total_timeout),
        ).expire("no worker started this job within the service's total_timeout")
    return expired


def rescue_stranded_local_jobs(now=None, *, stranded_after_s: float = STRANDED_AFTER_S) -> int:
    """Jobs routed to a local backend whose service has no consuming worker (it crashed, was
    stopped or was never started) go down the cascade like any failed attempt: a local attempt
    is recorded as failed and the next fallback gets the job. That covers queued jobs and the
    claims of a batch the dead worker was running (once inference_timeout has passed, no
    worker can still be finishing it; should one be, its claim token no longer matches and
    its results are dropped, so each job still ends with one result). Interactive jobs
    already past their deadline are expired by the claim instead. Returns jobs handed on."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=stranded_after_s)
    stranded = (
        JobRoute.objects.filter(backend__kind="local")
        .filter(
            Q(job__status=JobStatus.QUEUED, job__published_at__lt=cutoff)
            | Q(job__status=JobStatus.RUNNING, job__claimed_at__lt=cutoff)
        )
        .values_list("job__service__name", "job_id", "backend_id")[:5000]
    )
    by_service: dict[str, list[tuple[uuid.UUID, int]]] = {}
    for service_name, job_id, backend_id in stranded:
        by_service.setdefault(service_name, []).append((job_id, backend_id))
    cascade = FallbackCascade()
    handed_on = 0
    for service_name, rows in by_service.items():
        if consumer_count(queues.service_tier_queues(service_name)) > 0:
            continue  # a worker is there: the jobs are merely waiting their turn
        backend_of = dict(rows)
        service = Service.objects.get(name=service_name)
        dead_claim_before = now - timedelta(
            seconds=max(stranded_after_s, service.inference_timeout)
        )
        Job.objects.filter(pk__in=backend_of, claimed_at__lt=dead_claim_before).requeue()
        backends = Backend.objects.in_bulk(set(backend_of.values()))
        claim = Job.objects.claim(list(backend_of), worker="sweeper")
        reason = f"no worker consuming the {service_name} queues for {stranded_after_s:g} s"
        record_attempts(
            AttemptRecord(
                job_id=job.pk,
                backend=backends[backend_of[job.pk]],
                started_at=now,
                outcome=AttemptOutcome.FAILED,
                error=reason,
                worker="sweeper",
            )
            for job in claim.jobs
        )
        failed: list[Outcome] = []
        for job in claim.jobs:
            error = hand_on(
                job,
                claim.token,
                backends[backend_of[job.pk]],
                LocalEngineError(reason),
                cascade=cascade,
            )
            if error is None:
                handed_on += 1
            else:
                failed.append(Outcome(job=job, error=error))
        if failed:
            Job.objects.store_outcomes(claim.token, failed)
    return handed_on


def sweep_jobs() -> dict:
    return {
        "republished": republish_unpublished(),
        "lost_republished": republish_lost_messages(),
        "rescued": rescue_stranded_local_jobs(),
        "recovered": recover_stale_claims(),
        "expired": expire_overdue(),
        "bulks_finished": finish_stalled_bulks(),
    }
