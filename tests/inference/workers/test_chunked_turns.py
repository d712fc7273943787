"""A chunked generation's continuations wait for their tier's turn in the weighted share:
a long offline generation does not run a pass for every pass of claimed api work."""

from __future__ import annotations

import pytest

from inference.models import Job, JobStatus
from inference.scheduling.cost_model import BatchCostModel
from inference.workers.gpu import loop
from inference.workers.gpu.runner import BatchRunner
from tests.inference.workers.test_chunked_generation import LONG, as_if_measured

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_a_chunked_offline_generation_waits_its_turn_between_api_jobs(
    make_tenant, make_service, monkeypatch, generate_only
):
    from inference.dispatch.publishing import publish
    from inference.dispatch.queues import service_queues
    from tests.conftest import in_process_readers, purge_test_queues

    service = make_service(
        "llm", name="llm-turns", batch_size=4, batch_timeout=0.01, preemption_budget_s=0.1
    )
    purge_test_queues(service_queues(service.name))
    as_if_measured(service.name)
    # Held as measured, so every pass is sized the same way: one api job per pass (two would
    # be over the budget) and the offline generation in many chunks.
    monkeypatch.setattr(BatchCostModel, "observe_batch", lambda *a, **kw: None)
    passes: list[list[str]] = []
    start = loop.DrainLoop._start

    def recorded(self, batch):
        passes.append([h.job.tier for h in batch])
        return start(self, batch)

    monkeypatch.setattr(loop.DrainLoop, "_start", recorded)
    tenant, _ = make_tenant()
    offline = Job.objects.create(tenant=tenant, service=service, tier="offline", input=LONG)
    api = [
        Job.objects.create(
            tenant=tenant,
            service=service,
            tier="api",
            input={"prompt": "hi", "max_tokens": 40, "temperature": 0},
        )
        for _ in range(12)
    ]
    for job in api:
        publish(job)

    monkeypatch.setattr(loop, "DRAIN_LIMIT_S", 60.0)
    with in_process_readers(service.name) as readers:
        report = BatchRunner(readers).run(
            [str(offline.pk)], seed_redelivered=False, seed_tier="offline"
        )

    offline.refresh_from_db()
    assert offline.status == JobStatus.SUCCEEDED, (offline.status, report)
    assert offline.result["usage"]["completion_tokens"] == 240
    assert report["continued"] >= 5, report
    finished = Job.objects.filter(pk__in=[j.pk for j in api], status=JobStatus.SUCCEEDED)
    assert finished.count() == len(api)
    # Not after it: every api job finished while the offline generation was still running.
    assert max(finished.values_list("finished_at", flat=True)) < offline.finished_at
    assert all(len(tiers) == 1 for tiers in passes), passes
    ran = [tiers[0] for tiers in passes]
    ran = ran[: len(ran) - ran[::-1].index("api")]  # while api jobs were waiting
    # By the 5:2 share, two or three api jobs between two offline passes; a continuation
    # at the front of the line would run after every api job.
    offline_passes = [i for i, tier in enumerate(ran) if tier == "offline"]
    assert len(offline_passes) >= 3, ran
    gaps = [b - a - 1 for a, b in zip(offline_passes, offline_passes[1:], strict=False)]
    assert min(gaps) >= 2, ran
    assert ran.count("offline") <= ran.count("api") // 2 + 1, ran
