"""Priority with a real worker: bounded preemption, aging across workers, and every timeout
path (plans weigh the fair share between tenants: test_tenant_fairness.py). The no-op model
kind stands in for a slow model (`sleep_ms`), so the scenarios are exact and quick."""

from __future__ import annotations

import time
from collections import Counter

import pytest
from django.utils import timezone

from inference.dispatch.broker import ready_message_counts
from inference.dispatch.queues import tier_queue
from inference.intake.submission import submit_job
from inference.models import Job, JobStatus
from inference.scheduling.cost_model import BatchCostModel
from inference.workers.sweeper import expire_overdue, promote_waiting_jobs
from tests.conftest import in_process_loop, start_workers, stop_workers, wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def submit(tenant, service, *, sleep_ms=0, priority="batch", text="x", **kw):
    payload = {"texts": [text]} | ({"sleep_ms": sleep_ms} if sleep_ms else {})
    return submit_job(tenant=tenant, service_name=service, payload=payload, priority=priority, **kw)


def _tier_jobs(make_tenant, make_service, name: str, *, budget_s: float, sleep_ms: int):
    """A no-op service of the test's own (its queues emptied) with a preemption budget, and
    a maker of its jobs of one tier, each sleeping `sleep_ms`, stored but not published."""
    from inference.dispatch.queues import service_queues
    from tests.conftest import purge_test_queues

    service = make_service(
        "noop", name=name, batch_size=64, batch_timeout=0.01, preemption_budget_s=budget_s
    )
    purge_test_queues(service_queues(name))
    tenant, _ = make_tenant()

    def jobs(tier: str, n: int) -> list[Job]:
        return Job.objects.bulk_create(
            Job(
                tenant=tenant,
                service=service,
                tier=tier,
                input={"texts": ["x"], "sleep_ms": sleep_ms},
            )
            for _ in range(n)
        )

    return service, jobs


def test_a_realtime_job_waits_for_one_bounded_batch_not_a_long_one(
    celery_worker_process, make_tenant, make_service
):
    # 16 offline jobs of 200 ms each would be one 3.2 s batch; the 0.5 s budget cuts it to
    # batches of two, so a realtime job arriving at any moment starts within ~0.5 s.
    make_service("noop", batch_size=16, batch_timeout=0.5, preemption_budget_s=0.5)
    BatchCostModel("noop", "cpu").observe_batch(0.205, 200)  # as if measured: ~1 ms/token
    tenant, _ = make_tenant()
    backlog = [submit(tenant, "noop", sleep_ms=200, priority="offline") for _ in range(16)]
    time.sleep(0.7)  # the worker is in the middle of the backlog
    realtime = submit(tenant, "noop", priority="realtime", text="now")
    realtime = wait_for_job(realtime.pk, timeout_s=20)
    assert realtime.status == JobStatus.SUCCEEDED
    assert realtime.queue_wait_ms < 1500, realtime.queue_wait_ms
    sizes = {wait_for_job(j.pk, timeout_s=30).batch_size for j in backlog}
    assert max(sizes) <= 3


def test_aging_promotes_a_waiting_job_for_every_worker(
    make_tenant, make_service, django_db_blocker
):
    from inference.config.models import SchedulerSettings
    from inference.config.tiers import tier_policies
    from inference.dispatch.queues import service_queues
    from tests.conftest import purge_test_queues

    service = make_service("noop", name="aging", batch_size=4)
    # The copy a worker drops at its claim may still be queued when an earlier run on this
    # broker ended: the counts below are of this run's messages only.
    purge_test_queues(service_queues("aging"))
    SchedulerSettings.objects.update_or_create(
        pk=SchedulerSettings.SINGLETON_PK,
        defaults={"tiers": {"offline": {"aging_after_s": 1.0}, "batch": {"aging_after_s": 600}}},
    )
    assert tier_policies()["offline"].aging_after_s == 1.0
    tenant, _ = make_tenant()
    old = submit(tenant, "aging", priority="offline", text="old")  # no worker yet
    assert promote_waiting_jobs() == 0
    time.sleep(1.2)
    assert promote_waiting_jobs() == 1
    old.refresh_from_db()
    assert old.serving_tier == "batch"
    counts = ready_message_counts([tier_queue("aging", "batch"), tier_queue("aging", "offline")])
    assert counts == {tier_queue("aging", "batch"): 1, tier_queue("aging", "offline"): 1}
    assert promote_waiting_jobs() == 0  # batch's own threshold (600 s) is far away

    # Two workers: whichever takes a copy first runs it; the other copy is dropped at claim.
    workers = start_workers("aging0", "aging1", services=("aging",))
    try:
        done = wait_for_job(old.pk, timeout_s=30)
        assert done.status == JobStatus.SUCCEEDED and done.attempts == 1
        deadline = time.time() + 10
        while time.time() < deadline and any(
            ready_message_counts([tier_queue("aging", t) for t in ("batch", "offline")]).values()
        ):
            time.sleep(0.1)
        done.refresh_from_db()
        assert done.attempts == 1
    finally:
        stop_workers(workers)
        purge_test_queues(service_queues("aging"))
    assert service.pk


def test_every_timeout_path_expires_or_fails_the_job_with_its_reason(
    celery_worker_process, make_tenant, make_service
):
    make_service("noop", name="unserved", queue_timeout=0.2, total_timeout=5)  # no consumer
    make_service("noop", inference_timeout=0.3, batch_size=1)
    tenant, _ = make_tenant()

    waiting = submit(tenant, "unserved", priority="api")
    with_deadline = submit(tenant, "unserved", priority="offline", deadline_ms=200)
    time.sleep(0.4)
    assert expire_overdue(timezone.now()) == 2
    waiting.refresh_from_db()
    with_deadline.refresh_from_db()
    assert waiting.status == JobStatus.EXPIRED and "queue_timeout" in waiting.error
    assert with_deadline.status == JobStatus.EXPIRED and "deadline" in with_deadline.error

    too_slow = wait_for_job(submit(tenant, "noop", sleep_ms=3000).pk, timeout_s=20)
    assert too_slow.status == JobStatus.FAILED
    assert "inference_timeout (0.3 s)" in too_slow.error
    assert Job.objects.filter(pk=too_slow.pk, dead_lettered_at__isnull=True).exists()


def _offline_jobs_due_for_aging(make_tenant, make_service, name: str, count: int):
    """A service with no worker (its jobs stay queued) and `count` offline jobs submitted 5 s
    ago, past offline's 1 s aging threshold (batch's is 600 s). Returns the service."""
    from inference.config.models import SchedulerSettings

    service = make_service("noop", name=name)
    SchedulerSettings.objects.update_or_create(
        pk=SchedulerSettings.SINGLETON_PK,
        defaults={"tiers": {"offline": {"aging_after_s": 1.0}, "batch": {"aging_after_s": 600}}},
    )
    tenant, _ = make_tenant()
    long_ago = timezone.now() - timezone.timedelta(seconds=5)
    Job.objects.bulk_create(
        Job(tenant=tenant, service=service, tier="offline", input={"texts": [f"t{i}"]},
            created_at=long_ago)
        for i in range(count)
    )  # fmt: skip
    return service


def test_aging_promotes_every_due_job_in_one_run(make_tenant, make_service, monkeypatch):
    # A backlog submitted at once comes due at once: all of it moves up in one run, oldest
    # first, not one chunk per run (which left the rest waiting past their bound).
    from inference.workers import sweeper

    monkeypatch.setattr(sweeper, "PROMOTION_CHUNK", 10)
    service = _offline_jobs_due_for_aging(make_tenant, make_service, "aging-backlog", 25)
    assert promote_waiting_jobs() == 25
    assert set(Job.objects.filter(service=service).values_list("serving_tier", flat=True)) == {
        "batch"
    }
    counts = ready_message_counts([tier_queue("aging-backlog", "batch")])
    assert sum(counts.values()) >= 1  # published, a few jobs per message


def test_a_promotion_run_overlapping_another_one_moves_nothing_twice(make_tenant, make_service):
    # The control worker runs its tasks on threads: a promotion run that starts while the
    # previous one still runs must not re-publish the same jobs.
    import psycopg2
    from django.db import connection

    from inference.workers import sweeper

    service = _offline_jobs_due_for_aging(make_tenant, make_service, "aging-overlap", 1)
    other = psycopg2.connect(**connection.get_connection_params())
    try:
        with other.cursor() as cursor:  # the run already under way
            cursor.execute("SELECT pg_advisory_lock(%s)", [sweeper._PROMOTION_LOCK_KEY])
        assert promote_waiting_jobs() == -1
        assert Job.objects.get(service=service).serving_tier == ""
        with other.cursor() as cursor:  # that run ends (closing alone frees it a little later)
            cursor.execute("SELECT pg_advisory_unlock(%s)", [sweeper._PROMOTION_LOCK_KEY])
    finally:
        other.close()
    assert promote_waiting_jobs() == 1
    assert Job.objects.get(service=service).serving_tier == "batch"


def test_the_loop_claims_5_3_2_with_expired_p1_jobs_and_p3_in_eight_job_messages(
    make_tenant, make_service, monkeypatch
):
    # The bench's mix, in-process on the real broker and database: P1 and P2 jobs one to a
    # message, 40 % of the P1 jobs expired while queued, P3 jobs submitted in lists (8 to a
    # message). The loop claims live jobs 5:3:2 between the tiers below realtime.
    from inference.dispatch.publishing import publish, publish_many
    from inference.workers.gpu import loop
    from inference.workers.gpu.runner import BatchRunner
    from tests.conftest import in_process_readers

    service, jobs = _tier_jobs(make_tenant, make_service, "share-mix", budget_s=0.05, sleep_ms=10)
    BatchCostModel("share-mix", "cpu").observe_batch(0.0105, 10)  # ~1 ms per slept ms

    # 2 s of 10 ms jobs run at most 200: no tier runs out.
    api, batch, offline = jobs("api", 300), jobs("batch", 300), jobs("offline", 300)
    for job in api[1:] + batch:
        publish(job)
    publish_many(offline)
    expired = [job.pk for i, job in enumerate(api[1:]) if i % 5 < 2]
    Job.objects.filter(pk__in=expired).expire("test: waited too long")

    monkeypatch.setattr(loop, "DRAIN_LIMIT_S", 2.0)
    with in_process_readers("share-mix") as readers:
        BatchRunner(readers).run([str(api[0].pk)], seed_redelivered=False, seed_tier="api")

    claimed = Counter(
        Job.objects.filter(service=service, status=JobStatus.SUCCEEDED).values_list(
            "tier", flat=True
        )
    )
    total = sum(claimed.values())
    assert total >= 50, claimed  # enough to measure
    assert claimed["api"] / total == pytest.approx(0.5, abs=0.05), claimed
    assert claimed["batch"] / total == pytest.approx(0.3, abs=0.05), claimed
    assert claimed["offline"] / total == pytest.approx(0.2, abs=0.05), claimed


def test_a_realtime_job_claimed_into_a_window_it_does_not_fit_runs_in_the_next_pass(
    make_tenant, make_service
):
    # The loop pulled a realtime message while forming an offline batch that had no room
    # left for it (the window's run budget). It must run in the very next pass, ahead of the
    # offline jobs already claimed and waiting in the loop's line.
    from inference.dispatch.publishing import publish
    from inference.dispatch.queues import service_queues
    from inference.jobs.tiers import Tier
    from inference.workers import worker_identity
    from inference.workers.gpu.held import Held
    from tests.conftest import in_process_readers, purge_test_queues

    # A 1 ms budget: any job fills a pass (the first job of a window is always taken).
    service = make_service(
        "noop", name="rt-held", batch_size=64, batch_timeout=0.01, preemption_budget_s=0.001
    )
    purge_test_queues(service_queues("rt-held"))
    tenant, _ = make_tenant()

    def job(tier: str) -> Job:
        return Job.objects.create(
            tenant=tenant, service=service, tier=tier, input={"texts": ["x"], "sleep_ms": 30}
        )

    offline = [job("offline") for _ in range(3)]
    with in_process_readers("rt-held") as readers:
        loop = in_process_loop(service, readers)
        claim = Job.objects.claim([str(j.pk) for j in offline], worker=worker_identity())
        loop.line.front.extend(Held(j, claim) for j in claim.jobs)
        upcoming = loop.former.form()  # the first offline job: the window has no room left
        assert [h.job.pk for h in upcoming] == [offline[0].pk]

        realtime = job("realtime")
        publish(realtime)
        window = loop.former.new_window()
        assert window.offer(loop.former.item(upcoming[0]))
        # Does not fit the budget.
        loop.former.admit([loop.intake.reader.get([Tier.REALTIME])], window)

        batch = loop.realtime_first(upcoming)
        assert [h.job.pk for h in batch] == [realtime.pk]
        line = [h.job.pk for h in loop.line.front]
        assert line == [offline[0].pk, offline[1].pk, offline[2].pk]
        loop.ledger.ack(loop.ledger.unsettled())


def test_jobs_claimed_together_run_at_their_tiers_turn_not_back_to_back(
    make_tenant, make_service, monkeypatch
):
    # P2 and P3 jobs travel 8 to a message and the budget lets one job into a pass: the jobs
    # claimed together must wait for their tier's turn, so in the order the jobs ran no tier
    # runs 8 in a row and every tier runs in every 10 jobs (the share's floor).
    from inference.dispatch.publishing import publish, publish_many
    from inference.workers.gpu import loop
    from inference.workers.gpu.runner import BatchRunner
    from tests.conftest import in_process_readers

    service, jobs = _tier_jobs(make_tenant, make_service, "share-turns", budget_s=0.001, sleep_ms=3)

    api, batch, offline = jobs("api", 200), jobs("batch", 200), jobs("offline", 200)
    for job in api[1:]:
        publish(job)
    publish_many(batch)
    publish_many(offline)

    # Long enough for 40 one-job passes on a slow, busy machine.
    monkeypatch.setattr(loop, "DRAIN_LIMIT_S", 3.0)
    with in_process_readers("share-turns") as readers:
        BatchRunner(readers).run([str(api[0].pk)], seed_redelivered=False, seed_tier="api")

    ran = list(
        Job.objects.filter(service=service, status=JobStatus.SUCCEEDED)
        .order_by("started_at")
        .values_list("tier", flat=True)
    )
    # Once the drain limit stops the pulling, the loop runs what it still holds claimed (a
    # few P2/P3 jobs and no P1 job): the order is measured while P1 jobs were still running.
    ran = ran[: len(ran) - ran[::-1].index("api")]
    assert len(ran) >= 40, len(ran)  # enough to see the order
    longest = {tier: 0 for tier in ("api", "batch", "offline")}
    streak = 0
    for i, tier in enumerate(ran):
        streak = streak + 1 if i and ran[i - 1] == tier else 1
        longest[tier] = max(longest[tier], streak)
    assert longest["batch"] <= 2 and longest["offline"] <= 2, (longest, ran)
    windows = [ran[i : i + 10] for i in range(len(ran) - 9)]
    assert all({"api", "batch", "offline"} <= set(w) for w in windows), ran


def test_a_run_still_publishing_does_not_hold_back_the_next_runs_moves(
    make_tenant, make_service, monkeypatch
):
    # Publishing a second's worth of a due backlog, a confirm per message, took the bench's
    # control worker up to 1.5 s; a lock held through it made the next run skip, and the jobs
    # due meanwhile waited a second past their aging bound.
    import threading

    from django.db import connection

    from inference.workers import sweeper

    service = _offline_jobs_due_for_aging(make_tenant, make_service, "aging-publishing", 3)
    publishing, release = threading.Event(), threading.Event()
    publish_many = sweeper.publish_many

    def first_publish_is_slow(jobs):
        if not publishing.is_set():
            publishing.set()
            release.wait(10)
        return publish_many(jobs)

    monkeypatch.setattr(sweeper, "publish_many", first_publish_is_slow)
    first: list[int] = []

    def first_run() -> None:
        try:
            first.append(promote_waiting_jobs())
        finally:
            connection.close()

    thread = threading.Thread(target=first_run)
    thread.start()
    try:
        assert publishing.wait(10)
        # Two more come due while the first run publishes: the next run moves them at once.
        tenant = Job.objects.filter(service=service).first().tenant
        due_now = timezone.now() - timezone.timedelta(seconds=5)
        Job.objects.bulk_create(
            Job(tenant=tenant, service=service, tier="offline", input={"texts": [f"late {i}"]},
                created_at=due_now)
            for i in range(2)
        )  # fmt: skip
        assert promote_waiting_jobs() == 2
    finally:
        release.set()
        thread.join(10)
    assert first == [3]
    assert set(Job.objects.filter(service=service).values_list("serving_tier", flat=True)) == {
        "batch"
    }


def test_a_queue_of_jobs_past_their_deadline_does_not_hold_a_due_batch(
    make_tenant, make_service
):
    # A free tenant's realtime flood (served as api) leaves thousands of messages whose jobs
    # expire when claimed. A pro api job already in the window must run once its window is
    # due, not after the loop has claimed (and expired) the whole dead backlog.
    from datetime import timedelta

    from inference.dispatch.publishing import publish
    from inference.dispatch.queues import service_queues
    from inference.jobs.tiers import Tier
    from inference.workers import worker_identity
    from inference.workers.gpu.held import Held
    from tests.conftest import in_process_readers, purge_test_queues

    service = make_service(
        "noop", name="dead-backlog", batch_size=8, batch_timeout=0.005, queue_timeout=0.5
    )
    purge_test_queues(service_queues("dead-backlog"))
    tenant, _ = make_tenant()

    def job(**fields) -> Job:
        return Job.objects.create(
            tenant=tenant, service=service, tier="api", input={"texts": ["x"]}, **fields
        )

    long_ago = timezone.now() - timedelta(seconds=10)
    dead = [job(created_at=long_ago) for _ in range(120)]
    for each in dead:
        publish(each)
    due = job(created_at=timezone.now() - timedelta(seconds=0.1))
    with in_process_readers("dead-backlog") as readers:
        loop = in_process_loop(service, readers)
        claim = Job.objects.claim([str(due.pk)], worker=worker_identity())
        loop.former.hold(Held(claim.jobs[0], claim), Tier.API)

        batch = loop.former.form()

        assert [h.job.pk for h in batch] == [due.pk]
        left = ready_message_counts([tier_queue("dead-backlog", "api")])
        assert left[tier_queue("dead-backlog", "api")] > 100, left
        loop.ledger.ack(loop.ledger.unsettled())
    purge_test_queues(service_queues("dead-backlog"))


def test_realtime_work_of_another_service_is_not_held_behind_a_long_run(
    make_tenant, make_service
):
    from inference.dispatch.queues import service_queues
    from tests.conftest import WorkerProcess, purge_test_queues

    for name in ("long-run", "urgent"):
        make_service("noop", name=name, batch_size=1, batch_timeout=0.001)
        purge_test_queues(service_queues(name))
    tenant, _ = make_tenant()
    worker = WorkerProcess(services=("long-run", "urgent"), name="two-services")
    try:
        backlog = [submit(tenant, "long-run", sleep_ms=100, text=f"b{i}") for i in range(60)]
        deadline = time.time() + 30
        running = Job.objects.filter(pk__in=[j.pk for j in backlog], status=JobStatus.RUNNING)
        while time.time() < deadline and not running.exists():
            time.sleep(0.02)
        urgent = submit(tenant, "urgent", priority="realtime", text="now")
        urgent = wait_for_job(urgent.pk, timeout_s=30)
        done = [wait_for_job(j.pk, timeout_s=60) for j in backlog]
    finally:
        worker.stop()
        for name in ("long-run", "urgent"):
            purge_test_queues(service_queues(name))
    assert urgent.status == JobStatus.SUCCEEDED
    # A run drains its own service's backlog: the other service's realtime job ran in the
    # middle of it, not once it was drained.
    assert urgent.claimed_at < max(j.finished_at for j in done)
    assert sum(1 for j in done if j.claimed_at > urgent.finished_at) >= 10
