"""The one publish path: the outbox and the recoveries send a job where its backend is."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inference.models import Job, JobStatus
from inference.placement import record_decision
from inference.publishing import republish_unpublished
from inference.workers.sweeper import recover_stale_claims
from routing.models import AttemptOutcome, JobAttempt
from routing.router import RoutingDecision
from tests.conftest import wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def _routed_job_left_behind(tenant, service, backend) -> Job:
    """A job routed to a cloud backend whose publish never happened (the broker was down)."""
    job = Job.objects.create(
        tenant=tenant,
        service=service,
        tier="batch",  # batch work waits as long as it takes; an api job would expire
        input={"texts": ["left behind"]},
        created_at=timezone.now() - timedelta(seconds=60),
    )
    record_decision(job, RoutingDecision(backend, "test: routed to the cloud"))
    return job


def test_outbox_republishes_a_routed_job_to_its_backend_not_the_local_queue(
    io_workers, make_tenant, make_service, make_backend, make_route, upstream
):
    # No GPU worker consumes this service: a message on its local tier queue would sit there.
    service = make_service("embedding", name="outboxed")
    free = make_backend("free")
    make_route(service, (free, 0))
    tenant, _ = make_tenant()
    job = _routed_job_left_behind(tenant, service, free)

    assert republish_unpublished() == 1

    done = wait_for_job(job.pk, timeout_s=20)
    assert done.status == JobStatus.SUCCEEDED, done.error
    attempt = JobAttempt.objects.get(job=done)
    assert (attempt.backend, attempt.outcome) == (free, AttemptOutcome.SUCCEEDED)


def test_a_dead_claim_of_a_routed_job_is_recovered_on_its_backend(
    io_workers, make_tenant, make_service, make_backend, make_route, upstream
):
    service = make_service("embedding", name="deadclaim")
    free = make_backend("free")
    make_route(service, (free, 0))
    tenant, _ = make_tenant()
    job = _routed_job_left_behind(tenant, service, free)
    Job.objects.claim([job.pk], worker="an I/O worker that died")
    Job.objects.filter(pk=job.pk).update(claimed_at=timezone.now() - timedelta(hours=1))

    assert recover_stale_claims() == 1

    done = wait_for_job(job.pk, timeout_s=20)
    assert done.status == JobStatus.SUCCEEDED, done.error
    assert done.attempts == 2
    assert JobAttempt.objects.get(job=done).backend == free
