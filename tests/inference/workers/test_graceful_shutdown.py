"""SIGTERM to a GPU worker mid-batch: it finishes what it holds, stores, acks and exits; no job
of that batch is lost or run twice (a second worker takes whatever was still queued)."""

from __future__ import annotations

import time

import pytest

from inference.intake.submission import submit_job
from inference.models import AuditEvent, Job, JobStatus
from tests.conftest import WorkerProcess, wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def test_sigterm_mid_batch_loses_and_repeats_nothing(make_tenant, make_service):
    make_service("noop", name="draining", batch_size=4, batch_timeout=0.05)
    tenant, _ = make_tenant()
    jobs = [
        submit_job(
            tenant=tenant,
            service_name="draining",
            payload={"texts": [f"t{i}"], "sleep_ms": 150},
            priority="batch",
        )
        for i in range(24)
    ]
    first = WorkerProcess(services=("draining",), name="draining1")
    deadline = time.time() + 30
    while (
        time.time() < deadline
        and not Job.objects.filter(pk__in=[j.pk for j in jobs], status=JobStatus.RUNNING).exists()
    ):
        time.sleep(0.02)
    first.stop()  # SIGTERM: Celery's warm shutdown
    assert first.proc.returncode is not None
    second = WorkerProcess(services=("draining",), name="draining2")
    try:
        done = [wait_for_job(j.pk, timeout_s=60) for j in jobs]
    finally:
        second.stop()
    assert {j.status for j in done} == {JobStatus.SUCCEEDED}
    assert all(j.attempts == 1 for j in done), [j.attempts for j in done]
    completions = AuditEvent.objects.filter(job_id__in=[j.pk for j in jobs], kind="completed")
    assert completions.count() == len(jobs)
