"""A queued job says why it waits, how much work the workers serve before it, and when it should
start: the explanation follows the order the scheduler serves (realtime strictly first, the
tiers' weighted share, tenants' fair share inside a tier), and a full queue's Retry-After is
its predicted drain time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from rest_framework.test import APIClient

from inference.config.plans import plan_weight
from inference.dispatch import queue_position
from inference.dispatch.queue_position import explain_wait, retry_after_s
from inference.models import Job, JobStatus
from renq_site.shared_redis import shared_redis
from routing.stats import throughput_key, update_ewma
from tests.inference.job_rows import job_rows_read

pytestmark = pytest.mark.django_db

TEXT = {"texts": ["x" * 40]}


def measured(service, jobs_s: float) -> None:
    """The service's local workers measured at `jobs_s` per second (one worker process), with
    no batch cost model yet."""
    client = shared_redis()
    client.delete(throughput_key(service.name))
    for key in client.scan_iter(f"renq:cost:{service.name}:*"):
        client.delete(key)
    update_ewma(throughput_key(service.name), jobs_s)


def queue(tenant, service, n: int, tier: str = "batch", **fields) -> list[Job]:
    return [
        Job.objects.create(tenant=tenant, service=service, tier=tier, input=TEXT, **fields)
        for _ in range(n)
    ]


@pytest.fixture
def service(make_service):
    # No worker consumes it: what is queued stays queued.
    svc = make_service("noop", name="unserved-wait", batch_size=1, worker_count=1)
    measured(svc, 10.0)
    return svc


def test_a_job_behind_another_tenants_backlog_waits_for_its_fair_share(make_tenant, service):
    flooder, _ = make_tenant("flooder")
    quiet, _ = make_tenant("quiet")
    queue(flooder, service, 30)
    (mine,) = queue(quiet, service, 1)
    wait = explain_wait(mine)
    assert wait["reason"] == "tenant_fair_share", wait
    # Same plan, same sizes: one of the flood's jobs is served per job of its own, not 30.
    assert wait["position"] == 1, wait
    assert wait["work_ahead_tokens"] > 0
    # The flood's last job has its own 29 ahead and the quiet tenant's one.
    last = Job.objects.filter(tenant=flooder).order_by("-created_at").first()
    assert explain_wait(last)["position"] == 30


def test_a_heavier_plan_takes_more_of_the_tier_before_a_job(make_tenant, service):
    enterprise, _ = make_tenant("big", plan="enterprise")
    free, _ = make_tenant("small", plan="free")
    queue(enterprise, service, 20)
    queue(free, service, 20)
    free_first = Job.objects.filter(tenant=free).order_by("created_at").first()
    enterprise_last = Job.objects.filter(tenant=enterprise).order_by("-created_at").first()
    ratio = plan_weight("enterprise") / plan_weight("free")
    assert ratio > 1
    # The free tenant's first job waits for the enterprise tenant's weight's worth of jobs,
    # the enterprise tenant's last for its own 19 and a small part of the free backlog.
    assert explain_wait(free_first)["position"] == round(ratio), ratio
    assert explain_wait(enterprise_last)["position"] == 19 + round(20 / ratio)


def test_a_job_behind_a_higher_tier_waits_for_the_tier_share(make_tenant, service):
    tenant, _ = make_tenant("solo")
    queue(tenant, service, 12, tier="realtime")
    (mine,) = queue(tenant, service, 1, tier="api")
    wait = explain_wait(mine)
    assert wait["reason"] == "tier_share", wait
    assert wait["position"] == 12, wait
    # Batch behind api work: api's 5:3 share of the stretch counts ahead, not its whole backlog.
    Job.objects.filter(tier="realtime").update(status=JobStatus.SUCCEEDED)
    queue(tenant, service, 40, tier="api")
    (batch,) = queue(tenant, service, 1, tier="batch")
    wait = explain_wait(batch)
    assert wait["reason"] == "tier_share"
    assert 1 <= wait["position"] <= 2, wait


def test_a_job_alone_is_next_in_line_and_predicted_from_the_throughput(make_tenant, service):
    tenant, _ = make_tenant("solo")
    jobs = queue(tenant, service, 20, tier="batch")
    now = datetime.fromisoformat("2026-01-01T00:00:00+00:00")
    wait = explain_wait(jobs[-1], now=now)
    assert (wait["reason"], wait["position"]) == ("next_in_line", 19)
    # 19 jobs ahead at 10 jobs/s, then its own 1/10 s (nothing measured by the cost model).
    start = datetime.fromisoformat(wait["predicted_start"])
    finish = datetime.fromisoformat(wait["predicted_finish"])
    assert abs((start - now).total_seconds() - 1.9) < 1e-6
    assert abs((finish - start).total_seconds() - 0.1) < 1e-6
    # Running jobs hold the workers: half of each counts in the time to start.
    Job.objects.filter(pk=jobs[0].pk).update(status=JobStatus.RUNNING)
    wait = explain_wait(jobs[-1], now=now)
    assert wait["position"] == 18 and wait["running"] == 1
    assert (
        abs((datetime.fromisoformat(wait["predicted_start"]) - now).total_seconds() - 1.85) < 1e-6
    )


def test_a_tenant_at_its_quota_says_tenant_quota(make_tenant, service):
    tenant, _ = make_tenant("capped")
    tenant.max_running_jobs = 3
    tenant.save()
    jobs = queue(tenant, service, 3)
    wait = explain_wait(jobs[-1])
    assert wait["reason"] == "tenant_quota", wait
    assert "tenant_quota" in wait["reasons"]


def test_a_full_queue_says_queue_full(make_tenant, make_service):
    svc = make_service("noop", name="full-wait", max_queue_size=10)
    measured(svc, 10.0)
    tenant, _ = make_tenant("filler")
    jobs = queue(tenant, svc, 9)  # the non-realtime allowance: 10 less the realtime tenth
    assert explain_wait(jobs[-1])["reasons"][0] == "queue_full"


def test_the_api_shows_wait_while_the_job_is_queued_only(make_tenant, service):
    tenant, key = make_tenant("poller")
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    queue(tenant, service, 4)
    (job,) = queue(tenant, service, 1)
    body = api.get(f"/api/v1/jobs/{job.pk}").json()
    wait = body["wait"]
    assert body["status"] == "queued"
    assert wait["position"] == 4 and wait["reason"] == "next_in_line"
    for field in ("work_ahead_tokens", "predicted_start", "predicted_finish", "reasons"):
        assert field in wait
    assert datetime.fromisoformat(wait["predicted_finish"]) > datetime.fromisoformat(
        wait["predicted_start"]
    )
    # The list view leaves it out (a few queries a job).
    listed = api.get("/api/v1/jobs").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert rows and all("wait" not in row for row in rows)
    for status in (JobStatus.RUNNING, JobStatus.SUCCEEDED):
        Job.objects.filter(pk=job.pk).update(status=status)
        assert api.get(f"/api/v1/jobs/{job.pk}").json()["wait"] is None


def test_a_full_queue_s_retry_after_grows_with_its_backlog(api, make_service):
    retries = []
    for size in (10, 100):
        svc = make_service("noop", name=f"drain-{size}", max_queue_size=size)
        measured(svc, 4.0)
        queue(api.tenant, svc, size)
        response = api.post(
            "/api/v1/jobs",
            {"service": svc.name, "input": TEXT, "priority": "realtime"},
            format="json",
        )
        assert response.status_code == 503, response.content
        retries.append((int(response["Retry-After"]), int(response["retry-after-ms"])))
    # 10 and 100 queued jobs at 4 jobs/s: 2.5 s (3 in whole seconds) and 25 s.
    assert retries == [(3, 2500), (25, 25000)], retries


def test_retry_after_is_bounded(make_service):
    svc = make_service("noop", name="drain-bounds")
    measured(svc, 1000.0)
    assert retry_after_s(svc, 1) == 0.1
    measured(svc, 0.5)
    assert retry_after_s(svc, 10_000) == 60


def test_a_lone_job_queued_long_ago_waits_for_nothing(make_tenant, service):
    tenant, _ = make_tenant("old")
    (job,) = queue(tenant, service, 1, created_at=datetime.now().astimezone() - timedelta(hours=1))
    wait = explain_wait(job)
    assert wait["position"] == 0 and wait["reason"] == "next_in_line"


def test_a_deep_queue_is_read_whole_once_a_moment_and_a_jobs_own_line_each_time(
    make_tenant, service, monkeypatch
):
    monkeypatch.setattr(queue_position, "DEEP_BACKLOG_JOBS", 100)
    monkeypatch.setattr(queue_position, "_deep_backlogs", {})
    flood, _ = make_tenant("flood")
    mine, _ = make_tenant("mine")
    # Realtime: wholly ahead of a batch job, so every flood job read shows in its position.
    Job.objects.bulk_create(
        Job(tenant=flood, service=service, tier="realtime", input=TEXT) for _ in range(300)
    )
    first = queue(mine, service, 1)[0]
    whole_read, whole = job_rows_read(lambda: explain_wait(first))

    # Within the moment: the flood as read, the own tenant's line as it is now.
    queue(flood, service, 50, tier="realtime")
    second = queue(mine, service, 1)[0]
    kept_read, kept = job_rows_read(lambda: explain_wait(second))
    assert kept_read < 100 <= 300 < whole_read
    assert whole["position"] == 300
    assert kept["position"] == 301  # `first` is ahead of it

    # After it, the whole queue again: the 50 later flood jobs are seen.
    monkeypatch.setattr(queue_position, "DEEP_BACKLOG_KEPT_S", 0.0)
    assert explain_wait(second)["position"] == 351


def test_a_tenants_own_deep_line_is_kept_in_order_and_each_job_finds_its_place(
    make_tenant, service, monkeypatch
):
    monkeypatch.setattr(queue_position, "DEEP_BACKLOG_JOBS", 100)
    monkeypatch.setattr(queue_position, "_deep_backlogs", {})
    monkeypatch.setattr(queue_position, "_tenant_backlogs", {})
    other, _ = make_tenant("other")
    mine, _ = make_tenant("mine")
    queue(other, service, 20, tier="realtime")
    # Texts of several lengths, so each place is also a different sum of tokens ahead; the
    # last 50 ten to a created_at, as a POST of many jobs makes them, so ties go by id.
    start = datetime.now(UTC)
    jobs = [
        Job.objects.create(
            tenant=mine,
            service=service,
            tier="batch",
            input={"texts": ["x" * (8 * (i % 7))]},
            created_at=start + timedelta(milliseconds=i if i < 100 else 100 + i // 10),
        )
        for i in range(150)
    ]
    in_order = sorted(jobs, key=lambda job: (job.created_at, job.pk.bytes))
    sampled = [jobs[0], jobs[41], jobs[60], jobs[99], jobs[123], in_order[-1]]
    kept = [explain_wait(job) for job in sampled[:2]]  # the queue, then the tenant's line
    read, alone = job_rows_read(lambda: [explain_wait(job) for job in sampled[2:4]])
    assert read < 100  # two jobs placed in the line as read once (170 jobs)
    kept += alone + [explain_wait(job) for job in sampled[4:]]  # ties: those few read

    monkeypatch.setattr(queue_position, "DEEP_BACKLOG_KEPT_S", 0.0)
    fresh = [explain_wait(job) for job in sampled]
    places = [20 + in_order.index(job) for job in sampled]  # the realtime jobs, then its own
    assert [w["position"] for w in kept] == [w["position"] for w in fresh] == places
    assert [w["work_ahead_tokens"] for w in kept] == [w["work_ahead_tokens"] for w in fresh]
