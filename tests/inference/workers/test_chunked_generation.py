"""Chunked decoding: a low-tier LLM generation longer than the preemption budget runs in
passes of bounded decode steps, so realtime work runs between them, and its result is the
one it would have had in one pass. This is the generate() path, for models without
continuous batching (the worker here runs with it off)."""

from __future__ import annotations

import json
import time

import pytest

from inference.delivery.streaming import text_log
from inference.dispatch.queues import service_queues
from inference.engines import load_engine
from inference.engines.llm import CONTINUOUS_BATCHING_ENV
from inference.intake.submission import submit_job
from inference.models import Job, JobStatus
from inference.scheduling.cost_model import BatchCostModel
from inference.workers.gpu import loop
from inference.workers.gpu.runner import BatchRunner
from renq_site.shared_redis import shared_redis
from tests.conftest import WorkerProcess, purge_test_queues, wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

PROMPT = "once upon a time there was"
# The tiny model's context is 256 tokens: 240 new ones take it nearly to the end.
LONG = {"prompt": PROMPT, "max_tokens": 240, "temperature": 0}


def as_if_measured(service_name: str, per_token_s: float = 1e-3) -> None:
    """The cost model of a service as if measured (the tiny LLM decodes ~1 ms a token on a
    CPU thread): a whole 240-token generation is then far over a 0.1 s budget."""
    model = BatchCostModel(service_name, "cpu")
    shared_redis().delete(model.key)
    model.observe_batch(0.005 + per_token_s * 250, 250)


CHUNKED_SERVICE = "llm-chunked"


@pytest.fixture(scope="module")
def generate_only_worker(django_db_setup, django_db_blocker):
    """A worker of its own service whose LLM engine serves by generate() (chunked passes)."""
    purge_test_queues(service_queues(CHUNKED_SERVICE))
    worker = WorkerProcess(
        services=(CHUNKED_SERVICE,), name="generate-only", env={CONTINUOUS_BATCHING_ENV: "0"}
    )
    yield worker
    worker.stop()
    purge_test_queues(service_queues(CHUNKED_SERVICE))


def test_a_realtime_generation_runs_between_the_chunks_of_a_long_low_tier_one(
    generate_only_worker, make_tenant, make_service
):
    make_service(
        "llm", name=CHUNKED_SERVICE, batch_size=4, batch_timeout=0.01, preemption_budget_s=0.1
    )
    tenant, _ = make_tenant()
    # The worker loads the model on its first llm job: done before the scenario.
    warm = submit_job(
        tenant=tenant, service_name=CHUNKED_SERVICE, payload={"prompt": "hi", "max_tokens": 1}
    )
    assert wait_for_job(warm.pk, timeout_s=60).status == JobStatus.SUCCEEDED
    as_if_measured(CHUNKED_SERVICE)

    low = submit_job(
        tenant=tenant,
        service_name=CHUNKED_SERVICE,
        payload={**LONG, "stream": True},
        priority="offline",
    )
    deadline = time.time() + 30
    while (status := Job.objects.get(pk=low.pk).status) == JobStatus.QUEUED:
        assert time.time() < deadline, "the offline job never started"
        time.sleep(0.005)
    assert status == JobStatus.RUNNING  # its generation has begun
    # The same prompt, realtime: not chunked, so it is the one-pass result.
    realtime = submit_job(
        tenant=tenant, service_name=CHUNKED_SERVICE, payload=LONG, priority="realtime"
    )

    realtime = wait_for_job(realtime.pk, timeout_s=60)
    low = wait_for_job(low.pk, timeout_s=60)
    assert realtime.status == low.status == JobStatus.SUCCEEDED
    # Submitted while the offline generation ran, the realtime one ran and finished before
    # it: between two of its chunks. In one pass it would have waited for all of it.
    assert low.started_at < realtime.started_at
    assert realtime.finished_at < low.finished_at, (realtime.finished_at, low.finished_at)
    # Chunks continue exactly where the last one ended: the one-pass result.
    assert {k: low.result[k] for k in ("text", "usage", "finish_reason")} == realtime.result
    assert low.result["usage"]["completion_tokens"] == 240
    assert low.input_tokens == realtime.input_tokens  # prompt + max_tokens, as one pass
    assert low.result["first_token_ms"] > 0
    # Streamed across its passes: numbered on, and together the whole text.
    pieces = [json.loads(raw) for raw in shared_redis().lrange(text_log(low.pk), 0, -1)]
    assert [piece["seq"] for piece in pieces] == list(range(len(pieces)))
    assert "".join(piece["text"] for piece in pieces) == low.result["text"]


class NoBroker:
    """A reader pool with nothing to pull: as past the drain limit, only claimed jobs run."""

    def get(self, service_name):
        return None

    def discard(self, service_name):
        pass


def test_the_drain_finishes_a_chunked_generation_once_pulling_has_stopped(
    make_tenant, make_service, monkeypatch, generate_only
):
    monkeypatch.setattr(loop, "DRAIN_LIMIT_S", 0.0)
    service = make_service("llm", name="llm-drain", preemption_budget_s=0.05)
    as_if_measured(service.name)
    tenant, _ = make_tenant()
    payload = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0}
    job = Job.objects.create(tenant=tenant, service=service, tier="offline", input=payload)

    report = BatchRunner(NoBroker()).run([str(job.pk)], seed_redelivered=False, seed_tier=None)

    job.refresh_from_db()
    assert job.status == JobStatus.SUCCEEDED, (job.status, report)
    assert report["ran"] == 1 and report["continued"] >= 2
    assert report["batches"] == report["continued"] + 1  # one job, one pass after another
    engine = load_engine("llm", service.model_ref, device="cpu")
    assert job.result == engine.run_batch([payload])[0]
    assert job.input_tokens == engine.count_tokens(payload)
    assert job.inference_ms > 0
