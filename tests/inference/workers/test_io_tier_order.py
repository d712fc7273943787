"""Cloud jobs in tier order on an I/O worker: realtime first, then the weighted share, whatever
order their messages arrived in."""

from __future__ import annotations

import time
from collections import Counter

import pytest

from inference.dispatch.placement import record_decision
from inference.dispatch.publishing import publish
from inference.models import Job, JobStatus
from routing.router import RoutingDecision

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_an_io_worker_calls_realtime_first_then_the_tiers_by_share(
    make_tenant, make_service, make_backend, upstream, settings, monkeypatch
):
    import tests.conftest as conftest
    from inference.dispatch.queues import io_queues
    from tests.conftest import WorkerProcess, purge_test_queues

    # Queues of the test's own: the session's I/O workers (tests/routing) must not take these.
    prefix = f"{conftest.TEST_QUEUE_PREFIX}ioorder."
    settings.RENQ_QUEUE_PREFIX = prefix
    monkeypatch.setattr(conftest, "TEST_QUEUE_PREFIX", prefix)
    purge_test_queues(io_queues())
    service = make_service("embedding", name="io-order")
    backend = make_backend("ordered")
    upstream.script("ordered", mode="hang", hang_s=0.03)  # each call takes a while
    tenant, _ = make_tenant()

    counts = {"realtime": 6, "api": 20, "batch": 20, "offline": 20}
    # Published lowest tier first: arrival order is the opposite of tier order.
    for tier in ("offline", "batch", "api", "realtime"):
        for i in range(counts[tier]):
            job = Job.objects.create(
                tenant=tenant, service=service, tier=tier, input={"texts": [f"{tier} {i}"]}
            )
            record_decision(job, RoutingDecision(backend, "test: to the cloud"))
            assert publish(job)

    # One I/O thread, started once every message is queued.
    worker = WorkerProcess(
        services=(), concurrency=1, name="ioorder", extra_queues=tuple(io_queues()), pool="threads"
    )
    try:
        deadline = time.time() + 60
        total = sum(counts.values())
        while Job.objects.filter(service=service, status=JobStatus.SUCCEEDED).count() < total:
            assert time.time() < deadline, Counter(
                Job.objects.filter(service=service).values_list("status", flat=True)
            )
            time.sleep(0.1)
    finally:
        worker.stop()
        purge_test_queues(io_queues())

    called = []
    for call in upstream.calls("ordered"):
        text = call["body"]["input"]
        called.append((text[0] if isinstance(text, list) else text).split()[0])
    assert len(called) == total, called
    assert called[: counts["realtime"]] == ["realtime"] * counts["realtime"], called
    # Then, while all three tiers have work, 5:3:2 (15:9:6 in 30 calls), give or take the
    # message Celery delivered, which runs at its own tier's turn.
    first = Counter(called[counts["realtime"] : counts["realtime"] + 30])
    assert 14 <= first["api"] <= 16 and 8 <= first["batch"] <= 10, (first, called)
    assert 5 <= first["offline"] <= 7, (first, called)
