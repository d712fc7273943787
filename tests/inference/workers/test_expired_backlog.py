"""Messages whose jobs ended while they waited (expired during an outage, cancelled, sent
twice) are claimed and dropped in bulk by the run their first one starts, not one task each:
after a broker outage a worker reached live work seconds late, a task per expired job."""

from __future__ import annotations

import pytest

from inference.dispatch.publishing import publish
from inference.dispatch.queues import service_queues, tier_queue
from inference.models import Job, JobStatus
from inference.workers.gpu.runner import BatchRunner
from tests.conftest import in_process_readers, purge_test_queues

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_a_run_seeded_by_an_expired_job_drains_on_to_the_live_one_behind(
    make_tenant, make_service
):
    service = make_service("noop", name="expired-backlog", batch_size=8)
    purge_test_queues(service_queues(service.name))
    tenant, _ = make_tenant()
    expired = [
        Job.objects.create(tenant=tenant, service=service, tier="api", input={"texts": ["x"]})
        for _ in range(30)
    ]
    Job.objects.filter(pk__in=[job.pk for job in expired]).expire("queue_timeout passed")
    live = Job.objects.create(tenant=tenant, service=service, tier="api", input={"texts": ["y"]})
    for job in [*expired[1:], live]:
        publish(job)

    with in_process_readers(service.name) as readers:
        report = BatchRunner(readers).run(
            [str(expired[0].pk)],
            seed_redelivered=False,
            seed_tier="api",
            seed_queue=tier_queue(service.name, "api"),
        )

    live.refresh_from_db()
    assert live.status == JobStatus.SUCCEEDED
    assert report["ran"] == 1
    assert not Job.objects.filter(pk__in=[job.pk for job in expired]).exclude(
        status=JobStatus.EXPIRED
    ).exists()
