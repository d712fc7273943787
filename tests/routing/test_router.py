"""Router decisions on real Postgres and Redis: A/B weights, health, spill-over."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from decimal import Decimal

import pytest

from inference.dispatch.placement import ServiceWorkerProbe, forget_backlog_counts, routing_request
from inference.intake.submission import submit_job
from inference.models import Job, JobStatus, Service
from routing.breaker import CircuitBreaker
from routing.capacity import record_local_batch
from routing.limits import RateLimitTracker
from routing.models import JobRoute, RouteEntry
from routing.router import Router

pytestmark = pytest.mark.django_db


@dataclass
class WithIOWorkers:
    """The real probe of the service's workers, with I/O workers said to be running (these
    tests decide between backends; the I/O workers' presence is tested end to end)."""

    real: ServiceWorkerProbe
    io_workers: int = 1

    def local_consumer_count(self) -> int:
        return self.real.local_consumer_count()

    def io_consumer_count(self) -> int:
        return self.io_workers

    def predicted_wait(self):
        return self.real.predicted_wait()


def a_job(service, tenant, tier="api", texts=("hello world",), io_workers=1):
    """What the router sees of a job: the lifecycle describes it (inference.dispatch.placement)."""
    job = Job(service=service, tenant=tenant, tier=tier, input={"texts": list(texts)})
    request = routing_request(job)
    return replace(request, workers=WithIOWorkers(request.workers, io_workers))


def test_weighted_split_90_10_over_1000_decisions(
    make_service, make_tenant, make_backend, make_route
):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    a, b = make_backend("variant-a"), make_backend("variant-b")
    make_route(service, (a, 1, 90), (b, 1, 10))
    router = Router()
    picks = Counter(router.choose(a_job(service, tenant)).backend.name for _ in range(1000))
    assert 870 <= picks["variant-a"] <= 930, picks
    assert 70 <= picks["variant-b"] <= 130, picks


def test_weight_zero_rolls_a_variant_back(make_service, make_tenant, make_backend, make_route):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    a, b = make_backend("variant-a"), make_backend("variant-b")
    make_route(service, (a, 1, 50), (b, 1, 50))
    router = Router()
    assert len({router.choose(a_job(service, tenant)).backend.name for _ in range(20)}) == 2
    entry = RouteEntry.objects.get(backend=b)
    entry.weight = 0
    entry.save()  # as the admin does: the change marker drops every cached route
    assert {router.choose(a_job(service, tenant)).backend.name for _ in range(50)} == {"variant-a"}


def test_cheaper_backend_wins_and_the_reason_says_why(
    make_service, make_tenant, free_and_paid, make_route
):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    free, paid = free_and_paid
    make_route(service, (paid, 1), (free, 2))
    decision = Router().choose(a_job(service, tenant, texts=["word " * 400]))
    assert decision.backend == free
    assert decision.scores["free"] < decision.scores["paid"]
    assert "free scored" in decision.reason


def test_cooled_down_rate_limited_and_open_backends_are_skipped(
    make_service, make_tenant, free_and_paid, make_route
):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    free, paid = free_and_paid
    make_route(service, (free, 1), (paid, 2))
    router = Router()
    limits, breaker = RateLimitTracker(router.limits.redis), CircuitBreaker(router.limits.redis)

    limits.observe(free.pk, {"retry-after": "30"}, 429)
    decision = router.choose(a_job(service, tenant))
    assert decision.backend == paid
    assert "free: cooling down after 429" in decision.reason

    router.limits.redis.flushdb()
    limits.observe(
        free.pk, {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "1m"}, 200
    )
    assert router.choose(a_job(service, tenant)).backend == paid

    router.limits.redis.flushdb()
    free.failure_threshold = 1
    breaker.record_failure(free)
    assert router.choose(a_job(service, tenant)).backend == paid

    router.limits.redis.flushdb()
    assert router.choose(a_job(service, tenant)).backend == free


def test_context_length_and_capability_are_respected(
    make_service, make_tenant, make_backend, make_route
):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    small = make_backend("small", max_context_tokens=100)
    llm_only = make_backend("llm-only", service_kinds=["llm"])
    big = make_backend("big", cost_per_1k_input=Decimal("1"))
    make_route(service, (small, 1), (llm_only, 1), (big, 2))
    router = Router()
    assert router.choose(a_job(service, tenant, texts=["short"])).backend == small
    assert router.choose(a_job(service, tenant, texts=["word " * 200])).backend == big


def test_spill_over_realtime_goes_to_cloud_offline_waits(
    make_service, make_tenant, make_backend, free_and_paid, make_route, gpu_consumer, io_workers
):
    service = make_service("embedding", name="spill", queue_timeout=2, total_timeout=5)
    gpu_consumer.attach("spill")
    tenant, _ = make_tenant()
    local = make_backend("local-spill", kind="local")
    free, _ = free_and_paid
    make_route(service, (local, 0), (free, 1))
    record_local_batch("spill", jobs=10, seconds=1.0)  # measured: 10 jobs/s

    # No backlog: even realtime stays on the cheap local GPU.
    quiet = submit_job(
        tenant=tenant, service_name="spill", payload={"texts": ["x"]}, priority="realtime"
    )
    assert quiet.route.backend == local and quiet.route.predicted_local_wait_s < 2

    Job.objects.bulk_create(
        # Realtime is served first, so only a realtime backlog delays a realtime job.
        Job(service=service, tenant=tenant, tier="realtime", input={"texts": ["queued"]})
        for _ in range(100)
    )
    forget_backlog_counts()  # the router re-counts a backlog at most every 0.25 s
    realtime = submit_job(
        tenant=tenant, service_name="spill", payload={"texts": ["now"]}, priority="realtime"
    )
    offline = submit_job(
        tenant=tenant, service_name="spill", payload={"texts": ["later"]}, priority="offline"
    )
    assert realtime.route.backend == free
    assert realtime.route.predicted_local_wait_s == pytest.approx(10.2, abs=0.2)
    assert "spill-over" in realtime.route.reason and "realtime target 2 s" in realtime.route.reason
    assert offline.route.backend == local
    assert offline.route.predicted_local_wait_s > 10
    # Realtime jobs routed to the cloud do not count as local backlog.
    assert Job.objects.filter(service=service, status=JobStatus.QUEUED).count() == 103


def test_service_without_route_is_published_as_before(make_service, make_tenant):
    make_service("embedding")
    tenant, _ = make_tenant()
    job = submit_job(tenant=tenant, service_name="embedding", payload={"texts": ["x"]})
    assert not JobRoute.objects.filter(job=job).exists()


def test_with_no_local_worker_every_tier_goes_to_the_cloud_until_one_attaches(
    make_service, make_tenant, make_backend, free_and_paid, make_route, gpu_consumer
):
    make_service("embedding", name="noworker")
    tenant, _ = make_tenant()
    local = make_backend("local-noworker", kind="local")
    free, _ = free_and_paid
    make_route(Service.objects.get(name="noworker"), (local, 0), (free, 1))

    def route(tier):
        job = submit_job(
            tenant=tenant, service_name="noworker", payload={"texts": [tier]}, priority=tier
        )
        return job.route

    # Offline would wait for the cheap GPU, but nothing consumes its queues: nobody would run it.
    for tier in ("realtime", "offline"):
        decision = route(tier)
        assert decision.backend == free
        assert "no worker consuming the noworker queues" in decision.reason
    gpu_consumer.attach("noworker")
    assert route("offline").backend == local


def test_cloud_backends_are_skipped_while_no_io_worker_runs(
    make_service, make_tenant, make_backend, make_route
):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    free = make_backend("free")
    paid = make_backend("paid")
    make_route(service, (free, 0), (paid, 1))
    decision = Router().choose(a_job(service, tenant, io_workers=0))
    assert "no I/O worker consuming the io queues" in decision.reason


def test_a_cloud_backend_whose_key_is_unset_is_never_chosen(
    make_service, make_tenant, make_backend, make_route, monkeypatch
):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    keyless = make_backend("keyless", api_key_env="RENQ_TEST_UNSET_KEY")
    keyed = make_backend("keyed")
    make_route(service, (keyless, 0), (keyed, 1))
    monkeypatch.delenv("RENQ_TEST_UNSET_KEY", raising=False)
    decision = Router().choose(a_job(service, tenant))
    assert decision.backend == keyed
    assert "misconfigured: environment variable RENQ_TEST_UNSET_KEY is not set" in decision.reason
