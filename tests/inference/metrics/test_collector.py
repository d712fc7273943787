"""/metrics after real jobs on a real worker: scraped and parsed as Prometheus would."""

from __future__ import annotations

import os

import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from inference.metrics import collector, events
from inference.models import Job
from routing.models import Backend, Route, RouteEntry
from tests.conftest import WorkerProcess, purge_test_queues, wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]
# Its own service (so its own queues): no other test worker takes these jobs and records them
# in another metrics directory.
SERVICE = "metricsembed"
JOBS = 6


@pytest.fixture
def metrics_dir(tmp_path, monkeypatch):
    """A fresh multiprocess directory for the worker (inherited through the environment) and
    for the scrape."""
    directory = tmp_path / "prometheus"
    directory.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    monkeypatch.setattr(collector, "METRICS_DIR", str(directory))
    return directory


def scrape() -> dict[tuple[str, frozenset], float]:
    response = Client().get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples, name: str, **labels) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def test_metrics_after_real_jobs(metrics_dir, api, make_service):
    service = make_service("embedding", name=SERVICE, batch_size=4, batch_timeout=0.3)
    local = Backend.objects.create(name="local-metrics", kind="local", service_kinds=["embedding"])
    cloud = Backend.objects.create(
        name="cloud-metrics",
        kind="openai",
        base_url="http://127.0.0.1:9/v1",
        api_key_env="RENQ_TEST_FAKE_API_KEY",
        service_kinds=["embedding"],
        rpm_limit=10,
    )
    route = Route.objects.create(service=service)
    RouteEntry.objects.create(route=route, backend=local, order=0)
    RouteEntry.objects.create(route=route, backend=cloud, order=1)
    purge_test_queues()
    worker = WorkerProcess(services=(SERVICE,), name="metrics")
    try:
        ids = []
        for i in range(JOBS):
            response = api.post(
                "/api/v1/jobs",
                {"service": SERVICE, "priority": "batch", "input": {"texts": [f"metrics {i}"]}},
                format="json",
            )
            assert response.status_code == 202, response.content
            ids.append(response.json()["id"])
        done = [wait_for_job(job_id, timeout_s=90) for job_id in ids]
        assert {job.status for job in done} == {"succeeded"}
    finally:
        worker.stop()
    # Waiting work the scrape must count (never published, so no worker takes it).
    for _ in range(3):
        Job.objects.create(
            tenant=api.tenant, service=service, tier="offline", input={"texts": ["waits"]}
        )

    samples = scrape()
    assert any(p.name.endswith(".db") for p in metrics_dir.iterdir()), "worker wrote nothing"

    assert value(samples, "renq_jobs_finished_total", service=SERVICE, tier="batch",
                 status="succeeded", reason="ok") == JOBS  # fmt: skip
    assert value(samples, "renq_batch_size_count", service=SERVICE) >= 1
    assert value(samples, "renq_batch_size_sum", service=SERVICE) == JOBS
    assert value(samples, "renq_batch_tokens_sum", service=SERVICE) > 0
    assert value(samples, "renq_request_queue_time_seconds_count", service=SERVICE,
                 tier="batch") == JOBS  # fmt: skip
    assert value(samples, "renq_e2e_request_latency_seconds_count", service=SERVICE,
                 tier="batch") == JOBS  # fmt: skip
    assert (
        value(samples, "renq_inference_time_seconds_count", service=SERVICE,
              model=service.model_ref) >= 1
    )  # fmt: skip
    # Queue depth: every tier present, the waiting offline jobs counted.
    assert value(samples, "renq_queue_depth", service=SERVICE, tier="offline") == 3
    assert value(samples, "renq_queue_depth", service=SERVICE, tier="realtime") == 0
    assert value(samples, "renq_jobs_running", service=SERVICE) == 0
    # Backends: the local attempts, and the cloud backend's limits and breaker.
    assert value(samples, "renq_backend_attempts_total", backend="local-metrics",
                 outcome="succeeded") == JOBS  # fmt: skip
    assert value(samples, "renq_backend_rate_limit_headroom", backend="cloud-metrics") == 0.9
    assert value(samples, "renq_backend_cooldown", backend="cloud-metrics") == 0
    assert value(samples, "renq_backend_breaker_state", backend="cloud-metrics",
                 state="closed") == 1  # fmt: skip
    assert value(samples, "renq_backend_breaker_state", backend="cloud-metrics",
                 state="open") == 0  # fmt: skip


def test_a_metric_failure_never_reaches_the_caller(caplog):
    events.observe_batch(object(), [object()])  # not a service, not outcomes
    events.record_outcomes([object()])
    assert "metrics: could not" in caplog.text


def test_metrics_dir_is_multiprocess():
    assert os.environ["PROMETHEUS_MULTIPROC_DIR"]
    from prometheus_client import values

    assert getattr(values.ValueClass, "_multiprocess", False)


def test_the_grafana_dashboard_charts_only_metrics_renq_exports():
    import json
    import re

    from tests.conftest import ROOT

    dashboard = json.loads((ROOT / "docker" / "grafana" / "renq-dashboard.json").read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel["targets"]]
    used = {re.sub(r"_(bucket|sum|count|total)$", "", m) for e in exprs
            for m in re.findall(r"renq_[a-z0-9_]+", e)}  # fmt: skip
    exported = {
        metric._name for metric in vars(events).values()
        if hasattr(metric, "_name") and hasattr(metric, "labels")
    } | {"renq_queue_depth", "renq_jobs_running", "renq_backend_rate_limit_headroom",
         "renq_backend_cooldown", "renq_backend_breaker_state", "renq_fairness_index",
         "renq_backlogged_tenants"}  # fmt: skip
    assert used and used <= exported, used - exported
