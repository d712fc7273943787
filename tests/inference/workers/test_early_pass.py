"""A realtime job whose message carries its input starts its pass while its claim is under
way; the claim still decides whether that pass's outcome counts."""

from __future__ import annotations

import json
import threading

import pytest

from inference.dispatch.queues import tier_queue
from inference.engines.noop import NoopEngine
from inference.jobs.transitions import JobQuerySet
from inference.models import Job, JobStatus
from inference.workers.gpu.runner import BatchRunner
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


def _run_seed(job: Job, carried: str | None) -> dict:
    return BatchRunner(NoBroker()).run(
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
