"""Claims are leases: a live worker keeps its jobs however long it runs them, a hung or lost
one's jobs are taken over within seconds, and a worker that wakes after losing a lease has its
results dropped. A worker holds only what its next pass runs; the rest goes back for a peer."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
from django.db.models.expressions import RawSQL
from django.utils import timezone

from inference.dispatch.broker import ready_message_counts
from inference.dispatch.queues import service_queues
from inference.jobs.transitions import Outcome
from inference.models import Job, JobStatus
from inference.workers import worker_identity
from inference.workers.gpu import loop
from inference.workers.gpu.runner import BatchRunner
from inference.workers.leases import lease_keeper
from inference.workers.sweeper import take_over_lapsed_leases
from tests.conftest import purge_test_queues
from tests.inference.workers.test_chunked_generation import PROMPT, NoBroker, as_if_measured

pytestmark = pytest.mark.django_db(transaction=True)


def _queued(tenant, service, n: int = 1) -> list[Job]:
    return [
        Job.objects.create(tenant=tenant, service=service, tier="batch", input={"texts": [f"{i}"]})
        for i in range(n)
    ]


def _lapse(job: Job) -> None:
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))


def test_a_hung_workers_job_is_taken_over_and_its_late_result_dropped(make_tenant, make_service):
    tenant, _ = make_tenant()
    service = make_service("noop", name="lease-hung")
    job = _queued(tenant, service)[0]
    hung = Job.objects.claim([job.pk], worker="hung-host:1")
    assert hung.jobs and Job.objects.get(pk=job.pk).lease_expires_at > timezone.now()
    assert take_over_lapsed_leases() == 0  # a lease still running is left alone

    _lapse(job)  # the host stopped renewing
    assert take_over_lapsed_leases() == 1
    taken = Job.objects.get(pk=job.pk)
    assert taken.status == JobStatus.QUEUED and taken.published_at is not None
    assert sum(ready_message_counts(service_queues(service.name)).values()) == 1
    peer = Job.objects.claim([job.pk], worker="peer-host:2")

    # The hung host wakes: it renews nothing it lost and its result is dropped.
    assert Job.objects.renew_leases("hung-host:1", 30) == 0
    late = Outcome(job=hung.jobs[0], result={"from": "hung"}, inference_ms=1.0)
    assert Job.objects.store_outcomes(hung.token, [late]) == 0
    fresh = Outcome(job=peer.jobs[0], result={"from": "peer"}, inference_ms=1.0)
    assert Job.objects.store_outcomes(peer.token, [fresh]) == 1
    done = Job.objects.get(pk=job.pk)
    assert (done.status, done.result) == (JobStatus.SUCCEEDED, {"from": "peer"})
    purge_test_queues(service_queues(service.name))


def test_a_renewed_lease_is_not_taken_over(make_tenant, make_service):
    tenant, _ = make_tenant()
    service = make_service("noop", name="lease-renewed")
    job = _queued(tenant, service)[0]
    Job.objects.claim([job.pk], worker=worker_identity())
    _lapse(job)

    assert lease_keeper.renew_now() == 1
    assert take_over_lapsed_leases() == 0
    assert Job.objects.get(pk=job.pk).status == JobStatus.RUNNING


def test_a_claim_older_than_the_database_is_left_to_lapse(make_tenant, make_service):
    """Stores do not wait for the WAL flush, so a Postgres crash may undo one: the job is
    running again under a claim its worker has finished with. Only claims made since the
    database started are renewed, so that one lapses, is taken over and runs again."""
    tenant, _ = make_tenant()
    service = make_service("noop", name="lease-restart")
    before, since = _queued(tenant, service, 2)
    Job.objects.claim([before.pk, since.pk], worker=worker_identity())
    Job.objects.filter(pk=before.pk).update(
        claimed_at=RawSQL("pg_postmaster_start_time() - interval '1 second'", ())
    )
    _lapse(before)
    _lapse(since)

    assert lease_keeper.renew_now() == 1
    assert take_over_lapsed_leases() == 1
    assert Job.objects.get(pk=before.pk).status == JobStatus.QUEUED
    assert Job.objects.get(pk=since.pk).status == JobStatus.RUNNING
    purge_test_queues(service_queues(service.name))


def test_a_job_lost_too_often_fails_instead_of_running_again(make_tenant, make_service, settings):
    tenant, _ = make_tenant()
    service = make_service("noop", name="lease-poison")
    job = _queued(tenant, service)[0]
    Job.objects.filter(pk=job.pk).update(attempts=settings.RENQ_MAX_ATTEMPTS - 1)
    Job.objects.claim([job.pk], worker="dies-every-time:1")
    _lapse(job)

    assert take_over_lapsed_leases() == 0
    failed = Job.objects.get(pk=job.pk)
    assert failed.status == JobStatus.FAILED and "attempts" in failed.error


@pytest.mark.worker
def test_a_generation_longer_than_its_lease_is_never_taken_over_while_alive(
    make_tenant, make_service, settings, monkeypatch, generate_only
):
    settings.RENQ_LEASE_S = 1.0
    service = make_service("llm", name="llm-lease", preemption_budget_s=0.05)
    as_if_measured(service.name)
    tenant, _ = make_tenant()
    job = Job.objects.create(
        tenant=tenant,
        service=service,
        tier="offline",
        input={"prompt": PROMPT, "max_tokens": 200, "temperature": 0},
    )
    # Each pass made slow, so the generation outlives several leases.
    start = loop.DrainLoop._start

    def slow_start(self, batch):
        time.sleep(0.8)
        return start(self, batch)

    monkeypatch.setattr(loop.DrainLoop, "_start", slow_start)
    taken_over: list[int] = []
    running = threading.Event()

    def sweep() -> None:
        while running.is_set():
            taken_over.append(take_over_lapsed_leases())
            time.sleep(0.05)

    running.set()
    sweeper = threading.Thread(target=sweep)
    sweeper.start()
    began = time.monotonic()
    try:
        report = BatchRunner(NoBroker()).run([str(job.pk)], seed_redelivered=False, seed_tier=None)
    finally:
        running.clear()
        sweeper.join()
    assert time.monotonic() - began > 2 * settings.RENQ_LEASE_S

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, (job.status, job.error, report)
    assert report["continued"] >= 2  # several passes, all under the first claim
    assert job.attempts == 1 and sum(taken_over) == 0


def test_claimed_jobs_a_pass_cannot_take_go_back_for_a_peer(make_tenant, make_service):
    from inference.dispatch.publishing import RELEASED_PRIORITY, RUN_JOB_TASK, publish_task
    from inference.dispatch.queues import tier_queue
    from renq_site.celery import app

    tenant, _ = make_tenant()
    service = make_service("noop", name="lease-share", batch_size=2, batch_timeout=0.01)
    purge_test_queues(service_queues(service.name))
    jobs = _queued(tenant, service, 6)
    # Another tenant's flood, released one level under the top, already waits in the queue.
    queue = tier_queue(service.name, "batch")
    flood = _queued(make_tenant("flood")[0], service, 1)[0]
    publish_task(RUN_JOB_TASK, [str(flood.pk)], queue=queue, priority=RELEASED_PRIORITY)

    # One message's six jobs; the worker's pass takes two, the rest are handed back.
    report = BatchRunner(NoBroker()).run(
        [str(j.pk) for j in jobs], seed_redelivered=False, seed_tier=None
    )

    statuses = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    assert sorted(statuses.values()).count(JobStatus.SUCCEEDED) == 2
    assert sorted(statuses.values()).count(JobStatus.QUEUED) == 4
    assert report["handed_back"] == 4
    # Their messages wait in their queue for whichever worker is free, attempts not counted.
    assert sum(ready_message_counts(service_queues(service.name)).values()) >= 1
    back = Job.objects.filter(status=JobStatus.QUEUED, pk__in=[j.pk for j in jobs])
    assert set(back.values_list("attempts", flat=True)) == {0}
    assert all(j.worker == "" and j.lease_expires_at is None for j in back)
    # Their turn had come: they go ahead of the flood, not under it.
    with app.connection_for_read() as connection:
        head = app.amqp.queues[queue](connection.channel()).get(no_ack=True)
        assert str(flood.pk) not in str(head.decode()[0][0])
    purge_test_queues(service_queues(service.name))


@pytest.mark.worker
def test_an_idle_peer_takes_the_jobs_a_busy_worker_cannot_start(make_tenant, make_service):
    from inference.dispatch.publishing import publish_many
    from tests.conftest import start_workers, stop_workers, wait_for_job

    service = make_service("noop", name="shared-noop", batch_size=2, batch_timeout=0.01)
    tenant, _ = make_tenant()
    workers = start_workers("share1", "share2", services=(service.name,))
    try:
        jobs = [
            Job.objects.create(
                tenant=tenant,
                service=service,
                tier="batch",
                input={"texts": [f"{i}"], "sleep_ms": 400},
            )
            for i in range(8)
        ]
        # One message: before work-sharing, one worker ran all eight while the other idled.
        assert publish_many(jobs) == 8
        done = [wait_for_job(job.pk, timeout_s=120) for job in jobs]
    finally:
        stop_workers(workers)
        purge_test_queues(service_queues(service.name))
    assert {job.status for job in done} == {JobStatus.SUCCEEDED}
    assert len({job.worker for job in done}) == 2  # both workers ran some
    assert {job.attempts for job in done} == {1}  # handed back unstarted: no attempt counted


def test_a_process_stopped_on_request_hands_its_jobs_back_uncounted(
    make_tenant, make_service, monkeypatch
):
    # Celery terminates a pool process whose broker connection dropped under a running task
    # (billiard raises SystemExit on the SIGTERM): no job made it fail.
    tenant, _ = make_tenant()
    service = make_service("noop", name="lease-stopped", batch_size=2, batch_timeout=0.01)
    purge_test_queues(service_queues(service.name))
    jobs = _queued(tenant, service, 4)

    def stopped(self, batch):
        raise SystemExit(-241)

    monkeypatch.setattr(loop.DrainLoop, "_start", stopped)
    with pytest.raises(SystemExit):
        BatchRunner(NoBroker()).run(
            [str(j.pk) for j in jobs], seed_redelivered=False, seed_tier=None
        )

    ids = [j.pk for j in jobs]
    back = Job.objects.filter(pk__in=ids)
    assert {(j.status, j.attempts, j.worker) for j in back} == {(JobStatus.QUEUED, 0, "")}
    # Their messages come back redelivered: the next holder's claim is their first attempt.
    claim = Job.objects.claim(ids, redelivered_ids=ids, worker="peer:2")
    assert len(claim.jobs) == 4 and not claim.dead_lettered
    assert set(Job.objects.filter(pk__in=ids).values_list("attempts", flat=True)) == {1}


def test_renewing_leases_never_waits_for_a_store_under_way(make_tenant, make_service):
    """The lease keeper and the store thread write the same rows in different orders: were
    the renewal to wait for a row the store has locked, the two could deadlock (Postgres then
    fails one after a second's wait, and a drain run stalls). A row being stored is skipped:
    it is finishing, and any other is renewed again within a quarter of a lease."""
    tenant, _ = make_tenant()
    service = make_service("noop", name="lease-beside-store")
    storing, other = _queued(tenant, service, 2)
    Job.objects.claim([storing.pk, other.pk], worker=worker_identity())
    _lapse(storing)
    _lapse(other)
    locked, release = threading.Event(), threading.Event()

    def store_under_way() -> None:
        from django.db import connection, transaction

        try:
            with transaction.atomic():
                Job.objects.filter(pk=storing.pk).update(batch_size=1)  # holds the row's lock
                locked.set()
                release.wait(30)
        finally:
            connection.close()

    store = threading.Thread(target=store_under_way)
    store.start()
    try:
        assert locked.wait(10)
        renewed: list[int] = []

        def renew() -> None:
            from django.db import connection

            try:
                renewed.append(lease_keeper.renew_now())
            finally:
                connection.close()

        renewal = threading.Thread(target=renew)
        renewal.start()
        renewal.join(5)
        assert not renewal.is_alive(), "the renewal waited for the row being stored"
        assert renewed == [1]
        assert Job.objects.get(pk=other.pk).lease_expires_at > timezone.now()
    finally:
        release.set()
        store.join(10)
        renewal.join(30)
