"""The cascade end to end: REST/submit → Postgres → RabbitMQ → real GPU and I/O worker
processes → the fake upstream over real HTTP → results, attempts and costs back in Postgres."""

from __future__ import annotations

import time
from collections import Counter
from decimal import Decimal

import pytest

from inference.dispatch.placement import record_decision
from inference.dispatch.publishing import publish
from inference.intake.submission import submit_job
from inference.models import Job, JobStatus
from routing.capacity import record_local_batch
from routing.models import AttemptOutcome, JobAttempt
from routing.router import RoutingDecision
from tests.conftest import wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

MISSING_MODEL = "fixtures/models/no-such-model"


def attempts_of(job) -> list[tuple[str, str]]:
    return [
        (a.backend.name, a.outcome)
        for a in JobAttempt.objects.filter(job=job).select_related("backend").order_by("id")
    ]


def submit(tenant, service_name, text="hello world", priority="realtime"):
    return submit_job(
        tenant=tenant, service_name=service_name, payload={"texts": [text]}, priority=priority
    )


def test_local_backend_down_job_completes_on_first_cloud_fallback(
    celery_worker_process,
    io_workers,
    api,
    make_service,
    make_backend,
    free_and_paid,
    make_route,
    upstream,
):
    service = make_service("embedding", model_ref=MISSING_MODEL)  # the local worker raises
    local = make_backend("local-embedding", kind="local")
    free, paid = free_and_paid
    make_route(service, (local, 0), (free, 1), (paid, 2))

    response = api.post(
        "/api/v1/jobs",
        {"service": "embedding", "priority": "realtime", "input": {"texts": ["a cat"]}},
        format="json",
    )
    assert response.status_code == 202
    assert response.json()["backend"] == "local-embedding"
    job = wait_for_job(response.json()["id"], timeout_s=30)

    assert job.status == JobStatus.SUCCEEDED, job.error
    assert attempts_of(job) == [
        ("local-embedding", AttemptOutcome.FAILED),
        ("free", AttemptOutcome.SUCCEEDED),
    ]
    local_attempt = JobAttempt.objects.get(job=job, backend=local)
    assert "FileNotFoundError" in local_attempt.error
    body = api.get(f"/api/v1/jobs/{job.pk}").json()
    assert body["backend"] == "free"
    assert body["route_reason"].startswith("fallback after local-embedding failed")
    assert [(a["backend"], a["outcome"]) for a in body["backend_attempts"]] == [
        ("local-embedding", "failed"),
        ("free", "succeeded"),
    ]
    assert "FileNotFoundError" in body["backend_attempts"][0]["error"]
    assert len(body["result"]["embeddings"][0]) == 8  # the fake upstream's vectors
    assert len(upstream.calls("free")) == 1
    assert not upstream.calls("paid")


def test_429_cools_the_backend_down_for_every_worker_then_it_returns(
    io_workers, make_tenant, make_service, free_and_paid, make_route, upstream
):
    service = make_service("embedding", name="cloudonly")
    tenant, _ = make_tenant()
    free, paid = free_and_paid
    make_route(service, (free, 1), (paid, 2))
    upstream.script("free", mode="429", retry_after=2, times=1)

    first = wait_for_job(submit(tenant, "cloudonly").pk, timeout_s=20)
    assert first.status == JobStatus.SUCCEEDED, first.error
    assert attempts_of(first) == [("free", "rate_limited"), ("paid", "succeeded")]
    rate_limited_at = upstream.calls("free")[0]["t"]

    # Messages already on their way to `free` (published before the router could know): every
    # I/O worker process must see the cooldown and skip it, without calling it.
    in_flight = []
    for i in range(9):
        job = Job.objects.create(
            tenant=tenant, service=service, tier="realtime", input={"texts": [f"in flight {i}"]}
        )
        record_decision(job, RoutingDecision(free, "test: sent to free directly"))
        assert publish(job)
        in_flight.append(job)
    # And the router sends new jobs straight to the next backend meanwhile.
    routed = submit(tenant, "cloudonly")
    assert routed.route.backend == paid and "cooling down" in routed.route.reason

    jobs = [wait_for_job(j.pk, timeout_s=20) for j in [*in_flight, routed]]
    assert all(j.status == JobStatus.SUCCEEDED for j in jobs), [j.error for j in jobs]
    assert {j.route.backend.name for j in jobs} == {"paid"}
    skipped = JobAttempt.objects.filter(job__in=in_flight, backend=free)
    assert {a.outcome for a in skipped} == {AttemptOutcome.SKIPPED}
    assert all("cooldown" in a.error for a in skipped)
    assert len({a.worker for a in skipped}) >= 2  # the cooldown held in several processes
    assert len(upstream.calls("free")) == 1

    # After the cooldown, jobs return to the free backend.
    time.sleep(max(0.0, rate_limited_at + 2.05 - time.time()))
    back = wait_for_job(submit(tenant, "cloudonly").pk, timeout_s=20)
    assert back.route.backend == free and back.status == JobStatus.SUCCEEDED
    calls = upstream.calls("free")
    assert len(calls) == 2 and calls[1]["t"] - rate_limited_at >= 2.0


def test_remaining_requests_zero_stops_the_router_before_any_429(
    io_workers, make_tenant, make_service, free_and_paid, make_route, upstream
):
    service = make_service("embedding", name="quota")
    tenant, _ = make_tenant()
    free, paid = free_and_paid
    make_route(service, (free, 1), (paid, 2))
    upstream.script("free", mode="quota", quota=3, quota_window_s=30)

    backends = []
    for i in range(6):
        job = wait_for_job(submit(tenant, "quota", text=f"job {i}").pk, timeout_s=20)
        assert job.status == JobStatus.SUCCEEDED, job.error
        backends.append(job.route.backend.name)
    assert backends == ["free"] * 3 + ["paid"] * 3
    statuses = [c["status"] for c in upstream.calls("free")]
    assert statuses == [200, 200, 200]  # never a 429
    assert "rate limit reached" in Job.objects.latest("created_at").route.reason


def test_every_backend_failing_fails_the_job_with_every_reason(
    celery_worker_process, io_workers, make_tenant, make_service, make_backend, make_route, upstream
):
    service = make_service("embedding", model_ref=MISSING_MODEL)
    tenant, _ = make_tenant()
    local = make_backend("local-embedding", kind="local")
    broken = make_backend("broken")
    slow = make_backend("slow", timeout_s=0.5)
    garbled = make_backend("garbled")
    make_route(service, (local, 0), (broken, 1), (slow, 2), (garbled, 3))
    upstream.script("broken", mode="500")
    upstream.script("slow", mode="hang", hang_s=3)
    upstream.script("garbled", mode="malformed")

    job = wait_for_job(submit(tenant, "embedding").pk, timeout_s=30)

    assert job.status == JobStatus.FAILED
    assert attempts_of(job) == [
        ("local-embedding", "failed"),
        ("broken", "failed"),
        ("slow", "timeout"),
        ("garbled", "failed"),
    ]
    assert job.error.startswith("every backend failed (4)")
    for reason in ("FileNotFoundError", "HTTP 500", "no answer within 0.5 s", "malformed"):
        assert reason in job.error
    time.sleep(1.0)  # nothing is retried after the cascade's end
    assert [len(upstream.calls(n)) for n in ("broken", "slow", "garbled")] == [1, 1, 1]
    assert Job.objects.get(pk=job.pk).status == JobStatus.FAILED


def test_bad_input_rejected_upstream_ends_the_cascade_at_once(
    io_workers, make_tenant, make_service, free_and_paid, make_route, upstream
):
    service = make_service("embedding", name="strict")
    tenant, _ = make_tenant()
    free, paid = free_and_paid
    make_route(service, (free, 1), (paid, 2))
    upstream.script("free", mode="400")

    job = wait_for_job(submit(tenant, "strict").pk, timeout_s=20)
    assert job.status == JobStatus.FAILED
    assert "rejected the input" in job.error and "HTTP 400" in job.error
    assert attempts_of(job) == [("free", "rejected")]
    assert not upstream.calls("paid")


def test_rpm_limit_is_enforced_by_three_io_workers_together(
    io_workers, make_tenant, make_service, make_backend, make_route, upstream
):
    """rpm 10 per 3-s window on `limited` (a short window, so the test is fast); 3 worker
    processes with 8 threads each race for it: never more than 10 calls in a window."""
    service = make_service("embedding", name="burst")
    tenant, _ = make_tenant()
    limited = make_backend("limited", rpm_limit=10, rate_window_s=3.0)
    # The fallback costs more than any latency weighs (routing.router: $0.001 a job weighs
    # like 1 s): the router keeps to `limited` until its window is full, however slowly a
    # loaded machine makes the fake upstream answer.
    paid = make_backend("paid", cost_per_1k_input=Decimal("20"))
    make_route(service, (limited, 1), (paid, 2))

    jobs = [submit(tenant, "burst", text=f"burst {i}") for i in range(40)]
    jobs = [wait_for_job(j.pk, timeout_s=30) for j in jobs]
    assert all(j.status == JobStatus.SUCCEEDED for j in jobs)

    times = sorted(c["t"] for c in upstream.calls("limited"))
    # The limit was used, not avoided: 10 calls started on `limited` (one the fake upstream
    # failed to answer, under 24 racing threads, went on to `paid`).
    outcomes = Counter(JobAttempt.objects.filter(backend=limited).values_list("outcome", flat=True))
    started = sum(n for outcome, n in outcomes.items() if outcome != AttemptOutcome.SKIPPED)
    assert started >= 10 and len(times) <= started, (outcomes, len(times))
    for i, t in enumerate(times):
        assert sum(1 for u in times[i:] if u < t + 3.0 - 0.1) <= 10, times
    workers = {a.worker for a in JobAttempt.objects.filter(backend=limited)}
    assert len(workers) >= 2
    assert len(upstream.calls("paid")) == 40 - len(times)


def test_spill_over_realtime_runs_on_cloud_while_offline_waits_for_local(
    io_workers,
    make_tenant,
    make_service,
    make_backend,
    free_and_paid,
    make_route,
    upstream,
    gpu_consumer,
):
    service = make_service("embedding", name="spill", queue_timeout=2, total_timeout=5)
    gpu_consumer.attach("spill")  # a GPU worker is up (and busy): offline waits for it
    tenant, _ = make_tenant()
    local = make_backend("local-spill", kind="local")
    free, _ = free_and_paid
    make_route(service, (local, 0), (free, 1))
    record_local_batch("spill", jobs=10, seconds=1.0)
    Job.objects.bulk_create(
        Job(service=service, tenant=tenant, tier="realtime", input={"texts": ["backlog"]})
        for _ in range(60)
    )

    realtime = wait_for_job(submit(tenant, "spill", priority="realtime").pk, timeout_s=20)
    offline = submit(tenant, "spill", priority="offline")

    assert realtime.status == JobStatus.SUCCEEDED, realtime.error
    assert realtime.route.backend == free and "spill-over" in realtime.route.reason
    assert realtime.route.predicted_local_wait_s == pytest.approx(6.1, abs=0.2)
    assert offline.route.backend == local
    assert Job.objects.get(pk=offline.pk).status == JobStatus.QUEUED  # the GPU is busy
    assert attempts_of(realtime) == [("free", "succeeded")]


def test_costs_per_tenant_and_backend_and_saved_vs_all_cloud(
    celery_worker_process,
    io_workers,
    make_tenant,
    make_service,
    make_backend,
    free_and_paid,
    make_route,
    upstream,
    admin_client,
):
    from routing.costs import costs_by_backend, costs_by_tenant

    service = make_service("embedding")
    tenant, _ = make_tenant()
    local = make_backend("local-embedding", kind="local")
    free, paid = free_and_paid
    free.enabled = False  # on the route (free tiers are no all-cloud baseline) but not used
    free.save()
    make_route(service, (local, 0), (free, 1), (paid, 2))
    on_local = wait_for_job(submit(tenant, "embedding", text="one two three four").pk)
    assert on_local.status == JobStatus.SUCCEEDED and on_local.route.backend == local

    # A second job goes to the paid cloud backend because the local one is taken out.
    local.enabled = False
    local.save()
    on_cloud = wait_for_job(submit(tenant, "embedding", text="five six seven").pk)
    assert on_cloud.route.backend == paid

    local_attempt = JobAttempt.objects.get(job=on_local)
    cloud_attempt = JobAttempt.objects.get(job=on_cloud)
    assert local_attempt.cost == 0 and local_attempt.input_tokens > 0
    assert cloud_attempt.input_tokens == 3  # the fake bills one token per word
    assert cloud_attempt.cost == paid.cost_of(3, 0)

    [row] = costs_by_tenant()
    assert row.cost == cloud_attempt.cost
    expected_all_cloud = paid.cost_of(local_attempt.input_tokens + 3, 0)
    assert row.all_cloud_cost == expected_all_cloud
    assert row.saved == expected_all_cloud - cloud_attempt.cost > 0
    by_backend = {r.backend: r for r in costs_by_backend()}
    assert by_backend["paid"].cost == cloud_attempt.cost and by_backend["local-embedding"].cost == 0

    page = admin_client.get("/admin/routing/jobattempt/")
    assert page.status_code == 200
    assert b"saved vs all-cloud" in page.content and tenant.name.encode() in page.content


def test_jobs_stranded_on_a_stopped_local_worker_go_down_the_cascade(
    io_workers,
    make_tenant,
    make_service,
    make_backend,
    free_and_paid,
    make_route,
    upstream,
    gpu_consumer,
):
    from datetime import timedelta

    from django.utils import timezone

    from inference.jobs.transitions import Outcome
    from inference.workers.sweeper import rescue_stranded_jobs

    service = make_service("embedding", name="stranded")
    tenant, _ = make_tenant()
    local = make_backend("local-stranded", kind="local")
    free, paid = free_and_paid
    make_route(service, (local, 0), (free, 1), (paid, 2))
    gpu_consumer.attach("stranded")
    jobs = [submit(tenant, "stranded", text=f"t{i}", priority="batch") for i in range(3)]
    assert all(job.route.backend == local for job in jobs)

    # The worker was running the first job when it died: its claim is left behind.
    dead = Job.objects.claim([str(jobs[0].pk)], worker="dead-gpu-worker")
    Job.objects.filter(pk=jobs[0].pk).update(claimed_at=timezone.now() - timedelta(seconds=60))

    # A worker is consuming: queued jobs are only waiting their turn.
    assert rescue_stranded_jobs(stranded_after_s=0) == 0
    gpu_consumer.detach()  # the GPU worker stops; its unacked message goes back to the queue
    assert rescue_stranded_jobs(stranded_after_s=0) == 3
    # Should the dead worker come back with a result, it is no longer the job's to store.
    late = [Outcome(job=dead.jobs[0], result={"late": True})]
    assert Job.objects.store_outcomes(dead.token, late) == 0

    for job in jobs:
        done = wait_for_job(job.pk, timeout_s=20)
        assert done.status == JobStatus.SUCCEEDED, done.error
        assert attempts_of(done) == [
            ("local-stranded", AttemptOutcome.FAILED),
            ("free", AttemptOutcome.SUCCEEDED),
        ]
        assert (
            "no worker consuming the stranded queues"
            in JobAttempt.objects.filter(job=done, backend=local).get().error
        )
    assert len(upstream.calls("free")) == 3


def test_a_brief_worker_absence_keeps_jobs_local(
    make_tenant,
    make_service,
    make_backend,
    free_and_paid,
    make_route,
    upstream,
    gpu_consumer,
    io_workers,
):
    """A GPU worker restarting (model load included) must not send its backlog to a paid API:
    jobs move down the cascade only once the queues have had no consumer for the bound."""
    from datetime import timedelta

    from django.utils import timezone

    from inference.workers.sweeper import rescue_stranded_jobs

    service = make_service("embedding", name="restarting")
    tenant, _ = make_tenant()
    local = make_backend("local-restarting", kind="local")
    free, paid = free_and_paid
    make_route(service, (local, 0), (free, 1), (paid, 2))
    gpu_consumer.attach("restarting")
    jobs = [submit(tenant, "restarting", text=f"t{i}", priority="batch") for i in range(2)]
    gpu_consumer.detach()
    later = timezone.now() + timedelta(minutes=5)  # the jobs have waited long enough

    assert rescue_stranded_jobs(later, stranded_after_s=1.5) == 0  # unconsumed for ~0 s
    assert all(Job.objects.get(pk=j.pk).route.backend == local for j in jobs)
    time.sleep(1.6)
    assert rescue_stranded_jobs(later, stranded_after_s=1.5) == 2
    assert {Job.objects.get(pk=j.pk).route.backend for j in jobs} == {free}
