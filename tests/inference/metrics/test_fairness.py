"""Fairness between tenants on /metrics: Jain's index over the backlogged tenants of each tier
(scrape time), and queue wait and served work per tenant plan (recorded as outcomes are
stored)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from inference.jobs.transitions import Outcome
from inference.metrics import events, fairness
from inference.metrics.fairness import jain_index, weighted_shares
from inference.models import Job
from tests.inference.metrics.test_collector import metrics_dir, scrape, value  # noqa: F401

SERVICE = "fairembed"


# --- the maths -----------------------------------------------------------------------------------


def test_jain_index_is_one_for_equal_shares_and_one_over_n_for_one_taker():
    assert jain_index([5, 5, 5, 5]) == pytest.approx(1.0)
    assert jain_index([7, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([3, 1]) == pytest.approx(16 / 20)
    assert jain_index([1, 2, 3]) == pytest.approx(36 / 42)


def test_jain_index_of_nothing_served_is_equal_and_negative_work_is_refused():
    assert jain_index([]) == 1.0
    assert jain_index([0, 0, 0]) == 1.0
    with pytest.raises(ValueError):
        jain_index([1, -1])


def test_served_work_is_weighed_by_plan_and_starved_tenants_count_as_zero(monkeypatch):
    weights = {"enterprise": 2.0, "pro": 1.0, "free": 0.5}
    monkeypatch.setattr(fairness, "_plan_weight", lambda plan: weights[plan])
    plans = {1: "enterprise", 2: "pro", 3: "free"}
    # In proportion to the weights: fair.
    assert jain_index(weighted_shares({1: 400, 2: 200, 3: 100}, plans)) == pytest.approx(1.0)
    # Equal raw work is not fair between unequal plans.
    assert jain_index(weighted_shares({1: 100, 2: 100, 3: 100}, plans)) < 0.9
    # A backlogged tenant served nothing in the window is in the index, at zero.
    assert weighted_shares({1: 400}, plans) == [200.0, 0.0, 0.0]


@pytest.mark.django_db
def test_the_app_weighs_by_the_configured_plans():
    from inference.config.plans import plan_weight

    for plan in ("enterprise", "pro", "free", "unknown"):
        assert fairness.plan_weight(plan) == plan_weight(plan)


# --- on /metrics ---------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_metrics_export_the_fairness_index_of_backlogged_tenants(
    metrics_dir,  # noqa: F811
    make_service,
    make_tenant,
):
    service = make_service("embedding", name=SERVICE)
    heavy, _ = make_tenant("fair-heavy", plan="pro")
    light, _ = make_tenant("fair-light", plan="pro")
    gone, _ = make_tenant("fair-gone", plan="pro")
    now = timezone.now()

    def finished(tenant, tokens: int, tier: str = "batch", ago_s: float = 30, **fields):
        Job.objects.create(
            tenant=tenant, service=service, tier=tier, status="succeeded",
            input={"texts": ["x"]}, input_tokens=tokens,
            created_at=now - timedelta(seconds=ago_s + 1),
            finished_at=now - timedelta(seconds=ago_s), **fields,
        )  # fmt: skip

    def queued(tenant, tier: str = "batch"):
        Job.objects.create(tenant=tenant, service=service, tier=tier, input={"texts": ["x"]})

    # Served in the window: heavy 300 tokens, light 100; heavy's older work is outside it.
    finished(heavy, 200)
    finished(heavy, 100)
    finished(heavy, 5000, ago_s=fairness.FAIRNESS_WINDOW.total_seconds() + 60)
    finished(light, 100)
    # A tenant served much but with nothing queued now is not in the index.
    finished(gone, 10_000)
    # A failed job is no served work.
    Job.objects.create(
        tenant=light, service=service, tier="batch", status="failed", input={"texts": ["x"]},
        input_tokens=10_000, finished_at=now,
    )  # fmt: skip
    for tenant in (heavy, heavy, light):
        queued(tenant)
    # Another tier with one backlogged tenant: nothing to be unfair to.
    finished(heavy, 50, tier="offline")
    queued(heavy, tier="offline")

    samples = scrape()

    assert value(samples, "renq_backlogged_tenants", service=SERVICE, tier="batch") == 2
    # (300 + 100)² / (2 · (300² + 100²))
    assert value(samples, "renq_fairness_index", service=SERVICE, tier="batch") == pytest.approx(
        0.8
    )
    assert value(samples, "renq_backlogged_tenants", service=SERVICE, tier="offline") == 1
    assert value(samples, "renq_fairness_index", service=SERVICE, tier="offline") == 1.0
    assert value(samples, "renq_fairness_index", service=SERVICE, tier="realtime") == 1.0

    # Weighed by plan: the heavy tenant on enterprise (weight 2) has had its due.
    heavy.plan = "enterprise"
    heavy.save(update_fields=["plan"])
    samples = scrape()
    expected = jain_index(weighted_shares({heavy.pk: 300, light.pk: 100},
                                          {heavy.pk: "enterprise", light.pk: "pro"}))  # fmt: skip
    assert expected > 0.8
    assert value(samples, "renq_fairness_index", service=SERVICE, tier="batch") == pytest.approx(
        expected
    )


@pytest.mark.django_db(transaction=True)
def test_stored_outcomes_count_wait_and_served_work_per_plan(
    metrics_dir,  # noqa: F811
    make_service,
    make_tenant,
    monkeypatch,
):
    service = make_service("embedding", name=SERVICE + "2")
    paying, _ = make_tenant("plan-enterprise", plan="enterprise")
    free, _ = make_tenant("plan-free", plan="free")
    created = timezone.now() - timedelta(seconds=2)
    jobs = [
        Job.objects.create(
            tenant=tenant, service=service, tier="api", input={"texts": ["x"]}, created_at=created
        )
        for tenant in (paying, paying, free)
    ]
    claim = Job.objects.claim([job.pk for job in jobs], worker="fairness-test")
    assert len(claim.jobs) == 3
    started = timezone.now()
    outcomes = [
        Outcome(job=job, result={"n": 1}, started_at=started, tokens=7)
        if job.tenant_id == paying.pk
        else Outcome(job=job, error="boom", started_at=started)
        for job in claim.jobs
    ]
    assert Job.objects.store_outcomes(claim.token, outcomes) == 3

    # A batch whose tenants were not loaded (no claim in hand): one lookup, same series.
    monkeypatch.setattr(events, "TENANT_LABELS", True)
    late = Job.objects.create(
        tenant=free, service=service, tier="api", input={"texts": ["x"]}, created_at=created
    )
    claim = Job.objects.claim([late.pk], worker="fairness-test")
    bare = Job.objects.get(pk=late.pk)
    assert Job.objects.store_outcomes(
        claim.token, [Outcome(job=bare, result={"n": 1}, started_at=started, tokens=3)]
    ) == 1

    # Read from this process's own metrics (its multiprocess files may lie in the directory
    # an earlier test of the session set, not this test's).
    name = service.name
    enterprise, free_plan = (name, "api", "enterprise"), (name, "api", "free")
    assert histogram_count(events.TENANT_CLASS_QUEUE_TIME, *enterprise) == 2
    assert histogram_count(events.TENANT_CLASS_QUEUE_TIME, *free_plan) == 2
    assert events.TENANT_CLASS_QUEUE_TIME.labels(*enterprise)._sum.get() >= 2 * 1.5
    assert counted(events.TENANT_CLASS_SERVED_TOKENS, *enterprise) == 14
    assert counted(events.TENANT_CLASS_SERVED_JOBS, *enterprise) == 2
    # The failed job waited but was not served; the later success was.
    assert counted(events.TENANT_CLASS_SERVED_TOKENS, *free_plan) == 3
    assert counted(events.TENANT_CLASS_SERVED_JOBS, *free_plan) == 1
    # Per tenant only opted in: the late batch was recorded with the labels on.
    assert counted(events.TENANT_SERVED_TOKENS, name, "api", "plan-free") == 3
    assert counted(events.TENANT_SERVED_TOKENS, name, "api", "plan-enterprise") == 0


def counted(counter, *labels) -> float:
    return counter.labels(*labels)._value.get()


def histogram_count(histogram, *labels) -> float:
    return sum(bucket.get() for bucket in histogram.labels(*labels)._buckets)
