"""One queue depth (Issue #27): admission, `GET /api/v1/queues` and `renq_queue_depth` count the
same jobs, by the tier queue each waits in: bulk pieces included, their running parent not,
an aged job in the tier it was promoted to."""

from __future__ import annotations

import pytest
from django.db import connection, transaction

from inference.dispatch.queues import service_queues
from inference.intake.admission import QueueCapacityCheck
from inference.intake.bulk import submit_bulk
from inference.intake.submission import submit_job
from inference.jobs.tiers import TIER_ORDER, Tier
from inference.metrics.collector import StateCollector
from inference.models import Job, JobStatus
from tests.conftest import purge_test_queues

pytestmark = pytest.mark.django_db(transaction=True)


def admission_depth(service, tenant) -> int:
    """The depth admission's own statement counts (it returns it when the jobs fit)."""
    sql, params = QueueCapacityCheck(service, Tier.BATCH, 0, tenant).statement()
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchone()[0]


def metric_depths(service_name: str) -> dict[str, float]:
    family = next(f for f in StateCollector().collect() if f.name == "renq_queue_depth")
    return {
        s.labels["tier"]: s.value for s in family.samples if s.labels["service"] == service_name
    }


def test_admission_the_queue_report_and_the_metric_agree(make_service, make_tenant, api):
    service = make_service("noop", name="depth-noop", max_queue_size=10_000)  # no worker
    purge_test_queues(service_queues(service.name))
    tenant, other = api.tenant, make_tenant(name="other")[0]
    for priority, n in (("realtime", 2), ("api", 3), ("batch", 1)):
        for i in range(n):
            submit_job(tenant=tenant, service_name=service.name, payload={"texts": [f"{i}"]},
                       priority=priority)  # fmt: skip
    aged = submit_job(tenant=other, service_name=service.name, payload={"texts": ["old"]},
                      priority="offline")  # fmt: skip
    Job.objects.filter(pk=aged.pk).promote(Tier.BATCH)
    # 20 texts in pieces of 8: 3 queued offline pieces, the parent running.
    submit_bulk(tenant=other, service_name=service.name,
                payload={"texts": [f"t{i}" for i in range(20)]}, priority="offline")  # fmt: skip
    done = submit_job(tenant=tenant, service_name=service.name, payload={"texts": ["done"]})
    Job.objects.filter(pk=done.pk).update(status=JobStatus.SUCCEEDED)

    expected = {"realtime": 2, "api": 3, "batch": 1 + 1, "offline": 3}
    report = api.get("/api/v1/queues").json()["services"]
    reported = next(s for s in report if s["service"] == service.name)["tiers"]
    assert {tier: reported[tier]["depth"] for tier in reported} == expected
    assert metric_depths(service.name) == expected
    assert admission_depth(service, tenant) == sum(expected.values())
    assert set(expected) == {tier.value for tier in TIER_ORDER}
    purge_test_queues(service_queues(service.name))
