"""Fair queuing between the tenants of one tier: a tenant's flood does not hold another
tenant's jobs behind it, plans weigh the share, and nobody starves. Jobs are queued while no
worker serves the service, so the order RabbitMQ hands them out is exactly the scheduler's."""

from __future__ import annotations

import pytest

from inference.dispatch import fair_share
from inference.dispatch.queues import service_queues, tier_queue
from inference.intake.submission import submit_job
from renq_site.shared_redis import shared_redis
from tests.conftest import WorkerProcess, purge_test_queues, wait_for_job

TEN_TOKENS = "x" * 40


def fresh_service(make_service, name: str):
    """A one-job-per-pass no-op service with empty queues and a fresh fair-share clock."""
    service = make_service("noop", name=name, batch_size=1, batch_timeout=0.001)
    purge_test_queues(service_queues(name))
    client = shared_redis()
    for queue in service_queues(name):
        for key in client.scan_iter(f"renq:fair:{queue}:*"):
            client.delete(key)
    return service


def queue_jobs(tenant, service_name: str, n: int, tier: str = "batch") -> list:
    return [
        submit_job(
            tenant=tenant, service_name=service_name, payload={"texts": [TEN_TOKENS]}, priority=tier
        )
        for _ in range(n)
    ]


def run_all(service_name: str, jobs: list) -> dict:
    """Start a worker, wait for every job; job id → its start time."""
    worker = WorkerProcess(services=(service_name,), name=service_name)
    try:
        return {job.pk: wait_for_job(job.pk, timeout_s=60).started_at for job in jobs}
    finally:
        worker.stop()


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_quiet_tenant_is_not_held_behind_another_tenants_flood(make_tenant, make_service):
    fresh_service(make_service, "fair-flood")
    flooder, _ = make_tenant("flooder")
    quiet, _ = make_tenant("quiet")
    flood = queue_jobs(flooder, "fair-flood", 40)
    trickle = queue_jobs(quiet, "fair-flood", 3)  # arrives after the whole flood
    started = run_all("fair-flood", flood + trickle)
    order = sorted(started, key=started.get)
    positions = sorted(order.index(job.pk) for job in trickle)
    # In arrival order they would be 41st to 43rd; the flood's later jobs sank below them.
    assert positions[-1] < 10, positions
    assert all(started[job.pk] for job in flood)  # work-conserving: the flood ran too
    clock = float(shared_redis().get(f"renq:fair:{tier_queue('fair-flood', 'batch')}:v"))
    assert clock > 0  # the worker moved the tier queue's virtual time as it took messages


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_plans_weigh_the_share_of_a_contended_tier(make_tenant, make_service):
    # Each plan's tenant queues 8 jobs, free first and enterprise last; weights 2 : 1 : 0.5.
    # No tier boost, so all three share one tier and only the fair share orders them.
    from inference.config.models import DEFAULT_PLAN_WEIGHTS, PlanPolicy

    for plan, weight in DEFAULT_PLAN_WEIGHTS.items():
        PlanPolicy.objects.update_or_create(plan=plan, defaults={"tier_boost": 0, "weight": weight})
    fresh_service(make_service, "fair-plans")
    jobs = {}
    for plan in ("free", "pro", "enterprise"):
        tenant, _ = make_tenant(plan, plan=plan)
        jobs[plan] = queue_jobs(tenant, "fair-plans", 8)
    assert {job.tier for plan_jobs in jobs.values() for job in plan_jobs} == {"batch"}
    started = run_all("fair-plans", [job for plan_jobs in jobs.values() for job in plan_jobs])
    first = sorted(started, key=started.get)[:12]
    share = {plan: sum(job.pk in first for job in plan_jobs) for plan, plan_jobs in jobs.items()}
    assert share["enterprise"] > share["pro"] > share["free"] > 0, share


def test_a_message_s_band_halves_as_its_start_runs_further_ahead():
    assert [fair_share.band(ahead, 10, 3) for ahead in (0, 9.9, 10, 19, 20, 39, 40, 1e9)] == [
        3, 3, 2, 2, 1, 1, 0, 0,
    ]  # fmt: skip


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_backlogs_sent_while_the_worker_serves_share_by_plan_not_by_arrival(
    make_tenant, make_service
):
    # While a worker serves the tier, free sends its whole backlog first, then pro, then
    # enterprise: in arrival order free would run first. Weights 2 : 1 : 0.5.
    from inference.config.models import DEFAULT_PLAN_WEIGHTS, PlanPolicy
    from inference.models import JobStatus

    for plan, weight in DEFAULT_PLAN_WEIGHTS.items():
        PlanPolicy.objects.update_or_create(plan=plan, defaults={"tier_boost": 0, "weight": weight})
    fresh_service(make_service, "fair-live")
    tenants = {plan: make_tenant(plan, plan=plan)[0] for plan in ("free", "pro", "enterprise")}
    worker = WorkerProcess(services=("fair-live",), name="fair-live")
    try:
        # A long first job: the backlogs below are all queued before a second one starts.
        first = submit_job(
            tenant=tenants["pro"],
            service_name="fair-live",
            payload={"texts": [TEN_TOKENS], "sleep_ms": 3000},
            priority="batch",
        )
        wait_for_job(first.pk, timeout_s=30, statuses={JobStatus.RUNNING, JobStatus.SUCCEEDED})
        jobs = {plan: queue_jobs(tenant, "fair-live", 24) for plan, tenant in tenants.items()}
        started = {
            job.pk: wait_for_job(job.pk, timeout_s=60).started_at
            for plan_jobs in jobs.values()
            for job in plan_jobs
        }
    finally:
        worker.stop()
    first_28 = sorted(started, key=started.get)[:28]
    share = {plan: sum(job.pk in first_28 for job in plan_jobs) for plan, plan_jobs in jobs.items()}
    # SFQ gives 16 : 8 : 4; by arrival it would be 24 : 4 : 0 for free.
    assert share["enterprise"] > share["pro"] > share["free"] > 0, share
    assert share["enterprise"] >= 12, share


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_a_quiet_tenant_s_job_takes_a_place_in_the_batch_formed_before_it_came(
    make_tenant, make_service, monkeypatch
):
    # The next batch of a flood's jobs was formed while a pass ran; then a quiet tenant's job
    # went out fresh (nothing of its tenant ahead of the clock). It runs in that next pass, not
    # the one after: a quiet tenant waits for the pass that was running, however long the
    # flood's passes are.
    from inference.dispatch.broker import ready_message_counts
    from inference.dispatch.fair_share import FRESH_HEADER
    from inference.dispatch.publishing import RELEASED_PRIORITY, RUN_JOB_TASK, publish_task
    from inference.dispatch.queues import MAX_PRIORITY
    from inference.models import Job
    from inference.workers.gpu import loop as loop_module
    from tests.conftest import in_process_loop, in_process_readers

    monkeypatch.setattr(loop_module, "FRESH_LOOK_MIN_S", 0.0)  # the no-op model's passes are short
    service = fresh_service(make_service, "fair-fresh")
    service.batch_size = 2
    service.save()
    flooder, _ = make_tenant("flooder")
    quiet, _ = make_tenant("quiet")
    queue = tier_queue("fair-fresh", "batch")

    def send(tenant, priority: int, *, fresh: bool = False) -> Job:
        job = Job.objects.create(
            tenant=tenant, service=service, tier="batch", input={"texts": ["x"]}
        )
        headers = {FRESH_HEADER: True} if fresh else None
        publish_task(
            RUN_JOB_TASK, [str(job.pk)], queue=queue, priority=priority, extra_headers=headers
        )
        return job

    flood = [send(flooder, MAX_PRIORITY, fresh=True), send(flooder, RELEASED_PRIORITY)]
    with in_process_readers("fair-fresh") as readers:
        loop = in_process_loop(service, readers)
        upcoming = loop.former.form()  # formed while a pass runs
        assert [h.job.pk for h in upcoming] == [job.pk for job in flood]
        assert loop.fresh_first(upcoming) == upcoming  # nothing came since

        later = send(flooder, RELEASED_PRIORITY)
        assert loop.fresh_first(upcoming) == upcoming  # the flood's next job waits its turn
        assert ready_message_counts([queue])[queue] == 1

        fresh = send(quiet, MAX_PRIORITY, fresh=True)
        batch = loop.fresh_first(upcoming)
        assert [h.job.pk for h in batch] == [fresh.pk, flood[0].pk]
        assert [h.job.pk for h in loop.line.front] == [flood[1].pk]  # the next pass's first
        assert ready_message_counts([queue])[queue] == 1  # the flood's later job, untouched
        assert Job.objects.get(pk=later.pk).status == "queued"
        loop.ledger.ack(loop.ledger.unsettled())
