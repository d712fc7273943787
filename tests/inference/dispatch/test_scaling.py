"""renq_autoscale: the recommendation from queue depth, throughput and tier targets, and
--apply starting and stopping real local worker processes."""

from __future__ import annotations

import time
from io import StringIO

import pytest
from django.core.management import call_command

from inference.dispatch.scaling import apply, local_workers, recommend
from inference.models import Job
from routing.stats import throughput_key, update_ewma
from tests.renq_site.helpers import child_database_url

pytestmark = pytest.mark.django_db


def queue(tenant, service, tier: str, n: int) -> None:
    Job.objects.bulk_create(
        Job(tenant=tenant, service=service, tier=tier, input={"texts": ["x"]}) for _ in range(n)
    )


@pytest.fixture
def service(make_service):
    service = make_service("embedding", worker_count=4, queue_timeout=5, total_timeout=10)
    update_ewma(throughput_key(service.name), 10.0)  # one worker: 10 jobs/s, measured
    return service


def test_idle_service_keeps_the_minimum(service):
    assert recommend(service, minimum=1).recommended == 1
    assert recommend(service, minimum=0).recommended == 0


def test_batch_backlog_within_its_target_needs_one_worker(service, make_tenant):
    tenant, _ = make_tenant()
    queue(tenant, service, "batch", 2000)  # 200 s of work for one worker; target 900 s
    scale = recommend(service, minimum=0)
    assert (scale.needed, scale.recommended) == (1, 1)
    assert scale.queued["batch"] == 2000 and scale.measured


def test_interactive_backlog_scales_up_to_worker_count(service, make_tenant):
    tenant, _ = make_tenant()
    queue(tenant, service, "api", 120)  # 120 jobs / 5 s target / 10 jobs/s = 3 workers
    assert recommend(service).recommended == 3
    queue(tenant, service, "realtime", 300)  # 420 ahead of api: 9 workers, capped at 4
    scale = recommend(service)
    assert scale.needed == 9 and scale.recommended == 4


def test_the_command_prints_a_table(service, make_tenant):
    tenant, _ = make_tenant()
    queue(tenant, service, "api", 120)
    out = StringIO()
    call_command("renq_autoscale", stdout=out)
    row = next(line for line in out.getvalue().splitlines() if line.startswith("embedding"))
    assert row.split()[-1] == "3"


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_apply_starts_and_stops_local_workers(make_service, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", child_database_url())
    monkeypatch.setenv("RENQ_TORCH_THREADS", "1")
    service = make_service("embedding", name="scaleembed", worker_count=2)
    scale = recommend(service, minimum=2)
    try:
        assert apply(scale) == (2, 0)
        deadline = time.monotonic() + 30
        while len(local_workers("scaleembed")) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(local_workers("scaleembed")) == [0, 1]
        scale.recommended = 1
        assert apply(scale) == (0, 1)
        deadline = time.monotonic() + 60
        while len(local_workers("scaleembed")) > 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert sorted(local_workers("scaleembed")) == [0]
    finally:
        scale.recommended = 0
        apply(scale)
        deadline = time.monotonic() + 60
        while local_workers("scaleembed") and time.monotonic() < deadline:
            time.sleep(0.2)
