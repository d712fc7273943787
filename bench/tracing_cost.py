"""What tracing costs per job: the no-op run (bench.noop_throughput, one job per POST) with
tracing off, then on, exporting every span over OTLP/HTTP to a collector stand-in in this
process (it counts the spans and answers 200; its CPU is the client's, not the stack's).

The span queue is made large enough that no span is dropped, so "on" pays for every span a
job makes: the request's, the publish's, the task's, claim, forward pass and store, and the
instrumented Postgres and Redis calls of each.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from bench.common import JsonPoster, bench_tenant, purge_queues
from bench.noop_throughput import SERVICE, noop_service, run_case


class SpanSink(ThreadingHTTPServer):
    """Accepts OTLP/HTTP trace exports and counts their spans."""

    def __init__(self):
        self.spans = 0
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _SinkHandler)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _SinkHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - the http.server interface
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        request = ExportTraceServiceRequest.FromString(body)
        count = sum(len(s.spans) for r in request.resource_spans for s in r.scope_spans)
        with self.server.lock:
            self.server.spans += count
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args) -> None:
        pass


def _one_mode(env: dict[str, str], key: str, *, duration_s: float, cap: int) -> dict:
    from processes import ProcessGroup, free_port

    from inference.dispatch.queues import service_queues

    purge_queues(service_queues(SERVICE))
    with ProcessGroup(env=env) as procs:
        url = procs.web(free_port(), workers=2)
        procs.worker("bench-noop", service_queues(SERVICE))
        poster = JsonPoster(url, key)
        for i in range(20):  # warm-up: imports, connections
            status, _, answer = poster.post(
                "/api/v1/jobs", {"service": SERVICE, "input": {"texts": [f"warm {i}"]}}
            )
            if status != 202:
                raise RuntimeError(f"warm-up POST answered {status}: {answer[:500]!r}")
        time.sleep(1.0)
        return run_case(procs, url, key, threads=8, per_post=1, duration_s=duration_s, cap=cap)


def run(*, quick: bool) -> dict:
    noop_service()
    _, key = bench_tenant()
    duration_s, cap = (3.0, 2_000) if quick else (10.0, 20_000)
    sink = SpanSink()
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    results: dict = {}
    try:
        print("== tracing off", flush=True)
        results["off"] = _one_mode({}, key, duration_s=duration_s, cap=cap)
        print("== tracing on (OTLP/HTTP, every span exported)", flush=True)
        on_env = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
            "OTEL_BSP_MAX_QUEUE_SIZE": "1000000",
            "OTEL_BSP_SCHEDULE_DELAY": "500",
        }
        results["on"] = _one_mode(on_env, key, duration_s=duration_s, cap=cap)
        time.sleep(1.0)  # the last export of each process (on shutdown) has arrived
    finally:
        sink.shutdown()
    on, off = results["on"], results["off"]
    results["spans_per_job"] = sink.spans / max(1, on["succeeded"] + 20)
    results["cpu_ms_per_job_added"] = on["cpu_ms_per_job"] - off["cpu_ms_per_job"]
    results["cpu_ms_per_job_added_by_role"] = {
        role: round(on["cpu_ms_per_job_by_role"][role] - off["cpu_ms_per_job_by_role"][role], 3)
        for role in off["cpu_ms_per_job_by_role"]
    }
    print(
        f"tracing: CPU ms/job off {off['cpu_ms_per_job']:.2f}, on {on['cpu_ms_per_job']:.2f} "
        f"({results['spans_per_job']:.1f} spans/job); added by role "
        f"{results['cpu_ms_per_job_added_by_role']}",
        flush=True,
    )
    return results
