"""A realtime job whose message carries its input, or whose head start an idle worker took,
starts its pass before its claim returns; the claim still decides whether that pass's outcome
counts."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from django.db import connections

from inference.dispatch import handover
from inference.dispatch.broker import ready_message_counts
from inference.dispatch.head_start import MAX_OFFER_AGE_S, Offer
from inference.dispatch.queues import service_queues, tier_queue
from inference.engines.noop import NoopEngine
from inference.intake.submission import submit_job
from inference.jobs.transitions import JobQuerySet
from inference.models import Job, JobStatus
from inference.workers.gpu import early_pass
from inference.workers.gpu.runner import BatchRunner
from renq_site.shared_redis import shared_redis
from tests.conftest import purge_test_queues, wait_for_job
from tests.inference.workers.test_chunked_generation import NoBroker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


@pytest.fixture
def passes(monkeypatch):
    """Each forward pass of the no-op model sets `started`; each claim records whether a pass
    had started by the time it reached Postgres (waiting a while for one to)."""
    started = threading.Event()
    seen_at_claim: list[bool] = []
    run_batch, claim = NoopEngine.run_batch, JobQuerySet.claim

    def recording_run_batch(self, payloads):
        started.set()
        return run_batch(self, payloads)

    def recording_claim(self, *args, **kwargs):
        seen_at_claim.append(started.wait(timeout=1.0))
        return claim(self, *args, **kwargs)

    monkeypatch.setattr(NoopEngine, "run_batch", recording_run_batch)
    monkeypatch.setattr(JobQuerySet, "claim", recording_claim)
    return seen_at_claim


@pytest.fixture
def forward_runs(monkeypatch):
    """The input of each forward pass the no-op model ran."""
    runs: list[list[dict]] = []
    run_batch = NoopEngine.run_batch

    def counting_run_batch(self, payloads):
        runs.append(payloads)
        return run_batch(self, payloads)

    monkeypatch.setattr(NoopEngine, "run_batch", counting_run_batch)
    return runs


def _run_seed(job: Job, carried: str | None, runner: BatchRunner | None = None) -> dict:
    return (runner or BatchRunner(NoBroker())).run(
        [str(job.pk)],
        seed_redelivered=False,
        seed_tier="realtime",
        seed_queue=tier_queue(job.service.name, "realtime"),
        seed_input=carried,
    )


def _realtime_job(make_tenant, make_service, name: str) -> Job:
    service = make_service("noop", name=name)
    tenant, _ = make_tenant()
    return Job.objects.create(
        tenant=tenant, service=service, tier="realtime", input={"texts": ["a", "b"]}
    )


def test_a_carried_input_runs_before_the_claim_returns_and_is_stored(
    make_tenant, make_service, passes
):
    job = _realtime_job(make_tenant, make_service, "early-stored")

    report = _run_seed(job, json.dumps(job.input))

    job.refresh_from_db()
    assert passes == [True]  # the pass had started when the claim went out
    assert (job.status, job.result, job.attempts) == (JobStatus.SUCCEEDED, {"count": 2}, 1)
    assert job.batch_size == 1 and job.input_tokens is not None
    assert (report["ran"], report["batches"]) == (1, 1)


def test_without_a_carried_input_the_claim_comes_first(make_tenant, make_service, passes):
    job = _realtime_job(make_tenant, make_service, "early-absent")

    _run_seed(job, None)

    job.refresh_from_db()
    assert passes == [False]
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, {"count": 2})


def test_a_cancelled_job_whose_pass_started_early_stays_cancelled(
    make_tenant, make_service, passes
):
    job = _realtime_job(make_tenant, make_service, "early-cancelled")
    assert Job.objects.filter(pk=job.pk).cancel()

    report = _run_seed(job, json.dumps(job.input))

    job.refresh_from_db()
    assert passes == [True]
    assert job.status == JobStatus.CANCELLED
    assert (job.result, job.attempts, job.started_at) == (None, 0, None)
    assert report["ran"] == 0 and report["dropped"] == 1


def _offer(
    job_id, service_name: str, texts: list[str], age_s: float = 0.0, *, answered: bool = False
) -> Offer:
    return Offer(
        job_id=str(job_id),
        queue=tier_queue(service_name, "realtime"),
        carried=json.dumps({"texts": texts}),
        offered_at=time.time() - age_s,
        answered=answered,
    )


def test_a_head_start_taken_while_idle_is_the_seeds_pass(
    make_tenant, make_service, passes, forward_runs
):
    job = _realtime_job(make_tenant, make_service, "head-start")
    runner = BatchRunner(NoBroker())

    assert runner.head_starts.offered(_offer(job.pk, "head-start", ["a", "b"])) is not None
    report = _run_seed(job, None, runner)  # its message carried nothing: the offer did

    job.refresh_from_db()
    assert passes == [True]  # the pass had started when the claim went out
    assert len(forward_runs) == 1  # and it was the job's only pass
    assert (job.status, job.result, job.attempts) == (JobStatus.SUCCEEDED, {"count": 2}, 1)
    assert (report["ran"], report["batches"]) == (1, 1)


def test_a_head_start_of_another_job_is_dropped(make_tenant, make_service, forward_runs):
    job = _realtime_job(make_tenant, make_service, "head-start-other")
    runner = BatchRunner(NoBroker())
    never_committed = uuid.uuid4()

    assert runner.head_starts.offered(_offer(never_committed, "head-start-other", ["x"] * 5))
    _run_seed(job, None, runner)

    job.refresh_from_db()
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, {"count": 2})
    assert [len(run[0]["texts"]) for run in forward_runs] == [5, 2]
    assert not Job.objects.filter(pk=never_committed).exists()


def test_a_head_start_on_another_input_than_the_jobs_is_dropped(
    make_tenant, make_service, forward_runs
):
    # An offer made before the submit ran (the front door's) on what the job did not become.
    job = _realtime_job(make_tenant, make_service, "head-start-input")
    runner = BatchRunner(NoBroker())

    assert runner.head_starts.offered(_offer(job.pk, "head-start-input", ["a", "b", "c"]))
    _run_seed(job, None, runner)

    job.refresh_from_db()
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, {"count": 2})
    assert [len(run[0]["texts"]) for run in forward_runs] == [3, 2]


def test_no_head_start_during_a_run_or_from_a_stale_offer(make_tenant, make_service):
    make_service("noop", name="head-start-busy")
    runner = BatchRunner(NoBroker())

    stale = _offer(uuid.uuid4(), "head-start-busy", ["a"], age_s=2 * MAX_OFFER_AGE_S)
    assert runner.head_starts.offered(stale) is None
    runner.head_starts.begin(None)
    assert runner.head_starts.offered(_offer(uuid.uuid4(), "head-start-busy", ["a"])) is None
    runner.head_starts.end()
    assert runner.head_starts.offered(_offer(uuid.uuid4(), "head-start-busy", ["a"])) is not None


def _taking_in_background(runner: BatchRunner, offer: Offer) -> threading.Thread:
    """The head starts' thread taking `offer`, once its mark says it is taken."""

    def take() -> None:
        try:
            runner.head_starts.offered(offer, shared_redis())
        finally:
            connections.close_all()  # this thread's session, before the database is dropped

    thread = threading.Thread(target=take)
    thread.start()
    mark = handover.mark_key(offer.job_id)
    for _ in range(200):
        if shared_redis().get(mark) == handover.TAKEN:
            return thread
        time.sleep(0.01)
    raise AssertionError("the offer was not taken")


def test_a_head_start_handed_over_is_claimed_run_and_stored_by_its_taker(
    make_tenant, make_service, forward_runs
):
    service = make_service("noop", name="handed-run")
    purge_test_queues(service_queues(service.name))
    tenant, _ = make_tenant()
    runner = BatchRunner(NoBroker())
    job_id = uuid.uuid4()
    taking = _taking_in_background(runner, _offer(job_id, service.name, ["a", "b"], answered=True))

    submit_job(
        tenant=tenant,
        service_name=service.name,
        payload={"texts": ["a", "b"]},
        priority="realtime",
        job_id=job_id,
        head_start_offered=True,
    )
    taking.join(timeout=10)

    job = wait_for_job(job_id, timeout_s=10)  # its store ends after the thread moved on
    assert (job.status, job.result, job.attempts) == (JobStatus.SUCCEEDED, {"count": 2}, 1)
    assert len(forward_runs) == 1  # the head start was the job's only pass
    queue = tier_queue(service.name, "realtime")
    assert ready_message_counts([queue]) == {queue: 0}  # and it never had a message


def test_a_taken_head_start_never_answered_waits_for_its_message(
    make_tenant, make_service, forward_runs, monkeypatch
):
    # Its submit refused it, say, or is slower than the taker waits.
    monkeypatch.setattr(early_pass, "ANSWER_WAIT_S", 0.05)
    job = _realtime_job(make_tenant, make_service, "handed-never")
    runner = BatchRunner(NoBroker())

    _taking_in_background(runner, _offer(job.pk, job.service.name, ["a", "b"], answered=True)).join(
        timeout=10
    )
    report = _run_seed(job, None, runner)  # its message, published after all

    job.refresh_from_db()
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, {"count": 2})
    assert len(forward_runs) == 1  # the message's run adopted the head start
    assert (report["ran"], report["batches"]) == (1, 1)
