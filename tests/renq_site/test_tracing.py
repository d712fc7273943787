"""One job's trace across processes: the web request and its publish here, the message's
`traceparent`, and the worker's task, claim, forward pass and store in a real worker process."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import format_trace_id

from inference.dispatch.publishing import RUN_JOB_TASK, task_message
from inference.dispatch.queues import service_queues
from renq_site import tracing
from tests.conftest import WorkerProcess, purge_test_queues, wait_for_job

SERVICE = "tracednoop"
WORKER_SPANS = {"run/inference.run_job", "renq.claim", "renq.forward", "renq.store"}


@pytest.fixture
def web_spans():
    """Tracing on in this process (the web's side), into memory; off again after."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.enable(provider)
    yield exporter
    tracing.disable()


def test_off_by_default_no_trace_headers():
    assert not tracing.enabled()
    message = task_message(RUN_JOB_TASK, ["job"], priority=0)
    assert "traceparent" not in message.application_headers


def test_a_message_carries_its_publish_context(web_spans):
    with tracing.span("renq.publish"):
        message = task_message(RUN_JOB_TASK, ["job"], priority=0)
    (published,) = web_spans.get_finished_spans()
    context = tracing.message_context(message.application_headers)
    assert context is not None
    assert (context.trace_id, context.span_id) == (
        published.context.trace_id,
        published.context.span_id,
    )


def _worker_spans(path: Path, trace_id: str, timeout_s: float = 60.0) -> dict[str, dict]:
    """The worker's spans of the trace, by name, once all of WORKER_SPANS are written."""
    deadline = time.monotonic() + timeout_s
    found: dict[str, dict] = {}
    while time.monotonic() < deadline:
        if path.exists():
            for line in path.read_text().splitlines():
                span = json.loads(line)
                if span["context"]["trace_id"] == trace_id:
                    found.setdefault(span["name"], span)
        if WORKER_SPANS <= found.keys():
            return found
        time.sleep(0.2)
    raise AssertionError(f"worker spans of trace {trace_id}: only {sorted(found)}")


@pytest.mark.django_db(transaction=True)
@pytest.mark.worker
def test_one_jobs_trace_spans_web_broker_and_worker(tmp_path, api, make_service, web_spans):
    make_service("noop", name=SERVICE, batch_size=4, batch_timeout=0.01)
    purge_test_queues(service_queues(SERVICE))
    worker_file = tmp_path / "worker-spans.jsonl"
    worker = WorkerProcess(
        services=(SERVICE,),
        name="tracing",
        env={"RENQ_TRACING": "1", "RENQ_TRACE_FILE": str(worker_file)},
    )
    try:
        response = api.post(
            "/api/v1/jobs",
            {"service": SERVICE, "priority": "api", "input": {"texts": ["traced"]}},
            format="json",
        )
        assert response.status_code == 202, response.content
        job_id = response.json()["id"]
        assert wait_for_job(job_id, timeout_s=90).status == "succeeded"

        web = {span.name: span for span in web_spans.get_finished_spans()}
        publish = web["renq.publish"]
        request = next(s for s in web.values() if s.name.startswith("POST"))
        assert publish.parent.span_id == request.context.span_id
        assert list(publish.attributes["renq.job_ids"]) == [job_id]
        trace_id = "0x" + format_trace_id(request.context.trace_id)

        spans = _worker_spans(worker_file, trace_id)
    finally:
        worker.stop()
    # The task continues the message's trace; the job's claim, pass and store are in it.
    task = spans["run/inference.run_job"]
    assert task["parent_id"] == f"0x{publish.context.span_id:016x}"
    for name in ("renq.claim", "renq.forward", "renq.store"):
        assert spans[name]["parent_id"] == task["context"]["span_id"], name
    forward = spans["renq.forward"]
    assert job_id in forward["attributes"]["renq.job_ids"]
    assert [link["context"]["span_id"] for link in forward["links"]] == [task["context"]["span_id"]]
