"""/metrics exports the autoscaler's decision per service (what KEDA scales the workers on),
scraped and parsed as Prometheus would, for backlogs counted in the real Postgres."""

from __future__ import annotations

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from inference.models import Job
from routing.stats import throughput_key, update_ewma

pytestmark = pytest.mark.django_db
SERVICE = "autoscalemetrics"


def scrape() -> dict[tuple[str, frozenset], float]:
    response = Client().get("/metrics")
    assert response.status_code == 200
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.content.decode())
        for sample in family.samples
    }


def value(samples, name: str, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def queue(tenant, service, tier: str, n: int) -> None:
    Job.objects.bulk_create(
        Job(tenant=tenant, service=service, tier=tier, input={"texts": ["x"]}) for _ in range(n)
    )


@pytest.fixture
def service(make_service):
    service = make_service(
        "embedding", name=SERVICE, worker_count=4, queue_timeout=5, total_timeout=10
    )
    update_ewma(throughput_key(service.name), 10.0)  # one worker: 10 jobs/s, measured
    return service


def test_an_idle_service_wants_no_worker_and_the_series_exists(service):
    samples = scrape()
    assert value(samples, "renq_autoscale_desired_workers", service=SERVICE) == 0
    assert value(samples, "renq_autoscale_max_workers", service=SERVICE) == 4
    assert value(samples, "renq_autoscale_worker_jobs_per_second", service=SERVICE) == 10
    assert value(samples, "renq_autoscale_throughput_measured", service=SERVICE) == 1


def test_a_backlog_sets_the_desired_workers(service, make_tenant):
    tenant, _ = make_tenant()
    queue(tenant, service, "api", 120)  # 120 jobs / 5 s target / 10 jobs/s per worker = 3
    samples = scrape()
    assert value(samples, "renq_autoscale_desired_workers", service=SERVICE) == 3
    assert value(samples, "renq_autoscale_needed_workers", service=SERVICE) == 3
    # 120 jobs ahead of a new api job, 3 workers at 10 jobs/s: 4 s, inside the 5 s target.
    assert value(samples, "renq_autoscale_drain_seconds", service=SERVICE, tier="api") == 4


def test_the_desired_workers_stop_at_worker_count(service, make_tenant):
    tenant, _ = make_tenant()
    queue(tenant, service, "api", 120)
    queue(tenant, service, "realtime", 300)  # 420 ahead of api in 5 s: 9 workers
    samples = scrape()
    assert value(samples, "renq_autoscale_needed_workers", service=SERVICE) == 9
    assert value(samples, "renq_autoscale_desired_workers", service=SERVICE) == 4


def test_without_a_measurement_the_prior_is_used_and_flagged(make_service):
    make_service("embedding", name=SERVICE, batch_size=8, batch_timeout=0.3)
    samples = scrape()
    assert value(samples, "renq_autoscale_throughput_measured", service=SERVICE) == 0
    # batch_size / (batch_timeout + PRIOR_BATCH_RUN_S): 8 / 0.4 s.
    assert value(samples, "renq_autoscale_worker_jobs_per_second", service=SERVICE) == 20
