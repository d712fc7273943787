"""LLM jobs in a real worker with continuous batching (inference.workers.gpu.generation_loop):
results are generate()'s, a job joins generations already running, realtime work gets a row
when every row is busy, per-request temperature, a dead decode loop loses nothing, and a
worker killed mid-generation leaves every job final exactly once."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from inference.delivery.streaming import text_log
from inference.dispatch.publishing import publish
from inference.engines import load_engine
from inference.engines.llm import LlmEngine
from inference.intake.submission import submit_job
from inference.models import AuditEvent, AuditEventKind, Job, JobStatus
from inference.workers.gpu.runner import BatchRunner
from renq_site.shared_redis import shared_redis
from tests.conftest import wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TINY_LLM_REF = "fixtures/models/tiny-llm"
PROMPT = "once upon a time there was"


@pytest.fixture(scope="module")
def reference(tiny_models) -> LlmEngine:
    """generate() on the same model: what every greedy result must be."""
    return LlmEngine(TINY_LLM_REF, device="cpu", continuous=False)


def streamed(job_id) -> str:
    pieces = [json.loads(raw) for raw in shared_redis().lrange(text_log(job_id), 0, -1)]
    assert [piece["seq"] for piece in pieces] == list(range(len(pieces)))
    return "".join(piece["text"] for piece in pieces)


def wait_for_text(job_id, timeout_s: float = 60) -> None:
    """Until the job has streamed some text: its generation is under way."""
    deadline = time.time() + timeout_s
    while not shared_redis().llen(text_log(job_id)):
        assert time.time() < deadline, f"job {job_id} never streamed"
        time.sleep(0.005)


def warm_up(tenant, service_name: str) -> None:
    """The worker loads the model on its first llm job: done before the scenario."""
    job = submit_job(
        tenant=tenant, service_name=service_name, payload={"prompt": "hi", "max_tokens": 1}
    )
    assert wait_for_job(job.pk, timeout_s=90).status == JobStatus.SUCCEEDED


def test_results_are_generate_results(celery_worker_process, make_tenant, make_service, reference):
    make_service("llm", batch_size=4, batch_timeout=0.01)
    tenant, _ = make_tenant()
    payloads = [
        {"prompt": f"{PROMPT} number {i}", "max_tokens": 8 + 5 * i, "temperature": 0}
        for i in range(6)
    ]
    jobs = [submit_job(tenant=tenant, service_name="llm", payload=p) for p in payloads]
    done = [wait_for_job(job.pk, timeout_s=90) for job in jobs]
    assert [job.status for job in done] == [JobStatus.SUCCEEDED] * len(jobs)
    assert [job.result for job in done] == reference.run_batch(payloads)


def test_a_job_joins_a_generation_already_running_and_finishes_first(
    celery_worker_process, make_tenant, make_service, reference
):
    make_service("llm", batch_size=4, batch_timeout=0.01)
    tenant, _ = make_tenant()
    warm_up(tenant, "llm")
    long_payload = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True}
    long = submit_job(tenant=tenant, service_name="llm", payload=long_payload, priority="offline")
    wait_for_text(long.pk)
    short_payload = {"prompt": "hello", "max_tokens": 5, "temperature": 0}
    short = submit_job(tenant=tenant, service_name="llm", payload=short_payload, priority="api")

    short, long = wait_for_job(short.pk, timeout_s=60), wait_for_job(long.pk, timeout_s=90)
    assert short.status == long.status == JobStatus.SUCCEEDED
    # It did not wait for the running generation: it started and ended within it.
    assert long.started_at < short.started_at < short.finished_at < long.finished_at
    assert short.result == reference.run_batch([short_payload])[0]
    expected = reference.run_batch([{**long_payload, "stream": False}])[0]
    assert {k: long.result[k] for k in ("text", "usage", "finish_reason")} == expected
    assert streamed(long.pk) == long.result["text"]
    assert long.result["first_token_ms"] > 0


def test_a_realtime_job_runs_at_once_when_every_row_is_busy(
    celery_worker_process, make_tenant, make_service, reference
):
    # Two rows, both taken by long offline generations.
    make_service("llm", batch_size=2, batch_timeout=0.01)
    tenant, _ = make_tenant()
    warm_up(tenant, "llm")
    low_payload = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True}
    lows = [
        submit_job(tenant=tenant, service_name="llm", payload=low_payload, priority="offline")
        for _ in range(2)
    ]
    for low in lows:
        wait_for_text(low.pk)
    realtime_payload = {"prompt": "urgent", "max_tokens": 5, "temperature": 0}
    realtime = submit_job(
        tenant=tenant, service_name="llm", payload=realtime_payload, priority="realtime"
    )

    realtime = wait_for_job(realtime.pk, timeout_s=60)
    lows = [wait_for_job(low.pk, timeout_s=90) for low in lows]
    assert realtime.status == JobStatus.SUCCEEDED
    assert realtime.result == reference.run_batch([realtime_payload])[0]
    # It ran while both rows were busy (a low row paused for it), not after them.
    assert realtime.finished_at < min(low.finished_at for low in lows)
    expected = reference.run_batch([{**low_payload, "stream": False}])[0]
    for low in lows:
        assert low.status == JobStatus.SUCCEEDED
        assert {k: low.result[k] for k in ("text", "usage", "finish_reason")} == expected


def test_temperature_is_per_job_in_one_generation_loop(
    celery_worker_process, make_tenant, make_service, reference
):
    make_service("llm", batch_size=4, batch_timeout=0.01)
    tenant, _ = make_tenant()
    greedy_payload = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0}
    hot_payload = {**greedy_payload, "temperature": 2.0}
    jobs = [
        submit_job(tenant=tenant, service_name="llm", payload=payload)
        for payload in (greedy_payload, hot_payload, hot_payload)
    ]
    greedy, hot_a, hot_b = [wait_for_job(job.pk, timeout_s=90) for job in jobs]
    assert greedy.result == reference.run_batch([greedy_payload])[0]
    assert hot_a.result["text"] != greedy.result["text"]
    assert hot_a.result["text"] != hot_b.result["text"]


def test_a_dead_decode_loop_is_restarted_and_no_job_is_lost(make_tenant, make_service, reference):
    from tests.conftest import in_process_readers

    service = make_service("llm", name="llm-restart", batch_size=4, batch_timeout=0.01)
    tenant, _ = make_tenant()
    payloads = [{"prompt": f"{PROMPT} {i}", "max_tokens": 30, "temperature": 0} for i in range(6)]
    jobs = [
        Job.objects.create(tenant=tenant, service=service, tier="api", input=p) for p in payloads
    ]
    engine = load_engine("llm", service.model_ref, device="cpu")
    generator = engine.continuous
    restarts_before = generator.restarts
    crashed: list[int] = []

    def crash_once(batch):
        if len(batch) >= 2 and not crashed:
            crashed.append(generator.steps)
            raise ValueError("No more free blocks")  # what a full stock cache raises

    generator._step_hook = crash_once
    try:
        with in_process_readers(service.name) as readers:
            for job in jobs[1:]:
                publish(job)
            report = BatchRunner(readers).run(
                [str(jobs[0].pk)], seed_redelivered=False, seed_tier="api"
            )
    finally:
        generator._step_hook = None

    assert crashed and generator.restarts == restarts_before + 1
    assert report["ran"] == len(jobs) and report["failed"] == 0, report
    done = [Job.objects.get(pk=job.pk) for job in jobs]
    assert [job.status for job in done] == [JobStatus.SUCCEEDED] * len(jobs)
    assert all(job.attempts == 1 for job in done)
    assert [job.result for job in done] == reference.run_batch(payloads)


def test_a_worker_killed_mid_generation_leaves_every_job_final_exactly_once(
    celery_worker_process, make_tenant, make_service, reference
):
    make_service("llm", batch_size=4, batch_timeout=0.01)
    tenant, _ = make_tenant()
    warm_up(tenant, "llm")
    payload = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "stream": True}
    jobs = [
        submit_job(tenant=tenant, service_name="llm", payload=payload, priority="batch")
        for _ in range(6)
    ]
    wait_for_text(jobs[0].pk)
    running = Job.objects.get(pk=jobs[0].pk)
    killed_pid = int(running.worker.rsplit(":", 1)[1])
    os.kill(killed_pid, signal.SIGKILL)

    done = [wait_for_job(job.pk, timeout_s=120) for job in jobs]
    assert {job.status for job in done} == {JobStatus.SUCCEEDED}
    assert all(not job.worker.endswith(f":{killed_pid}") for job in done)
    # The killed run stored nothing; the next one stored each job once.
    assert Job.objects.get(pk=jobs[0].pk).attempts == 2
    completed = AuditEvent.objects.filter(
        kind=AuditEventKind.COMPLETED, job_id__in=[job.pk for job in jobs]
    )
    assert sorted(str(e.job_id) for e in completed) == sorted(str(job.pk) for job in jobs)
    expected = reference.run_batch([{**payload, "stream": False}])[0]
    for job in done:
        assert {k: job.result[k] for k in ("text", "usage", "finish_reason")} == expected


def test_a_generation_past_the_inference_timeout_fails_and_frees_its_row(
    make_tenant, make_service, reference
):
    from tests.conftest import in_process_readers

    service = make_service(
        "llm", name="llm-timeout", batch_size=2, batch_timeout=0.01, inference_timeout=0.3
    )
    tenant, _ = make_tenant()
    long = Job.objects.create(
        tenant=tenant,
        service=service,
        tier="batch",
        input={"prompt": PROMPT, "max_tokens": 250, "temperature": 0},
    )
    short_payload = {"prompt": "hello", "max_tokens": 5, "temperature": 0}
    short = Job.objects.create(tenant=tenant, service=service, tier="api", input=short_payload)
    engine = load_engine("llm", service.model_ref, device="cpu")
    generator = engine.continuous

    def slow_steps(batch):
        time.sleep(0.01)  # 250 steps then take far longer than the timeout

    generator._step_hook = slow_steps
    try:
        with in_process_readers(service.name) as readers:
            publish(short)
            report = BatchRunner(readers).run(
                [str(long.pk)], seed_redelivered=False, seed_tier="batch"
            )
    finally:
        generator._step_hook = None

    long.refresh_from_db()
    short.refresh_from_db()
    assert long.status == JobStatus.FAILED and "inference_timeout" in long.error, long.error
    assert short.status == JobStatus.SUCCEEDED
    assert short.result == reference.run_batch([short_payload])[0]
    assert report["failed"] == 1 and report["ran"] == 1, report
    assert generator.in_flight == 0
