"""The realtime fast path (issue 29), in one run on this machine:

- overhead at idle: one short text, `X-Renq-Priority: realtime`, sequential requests on a
  keep-alive connection, client-observed time minus the raw forward pass of the same texts
  (the engine in this process, same threads), p50/p99, for POST /v1/embeddings and for
  POST /api/v1/jobs?wait= (config.yaml's embedding runtime, rate limit lifted); on the
  shared cores as the README runs it, then again with the model on a core of its own (as on
  a GPU host, where the pass shares no core with the stack);
- the idle trace: the same requests with tracing on (spans written to a file by each
  process), each stage's p50/p99 from its spans. Tracing adds its own cost to every stage:
  the stages say where the time goes, the overhead above says how much there is;
- realtime under a batch backlog: client-observed /v1/embeddings latency while 100-job
  batch-tier POSTs keep the queue growing;
- CPU per no-op job against plain Celery, side by side: renq's single-job and 100-job POSTs
  (bench.noop_throughput) and `apply_async` of a no-op task from 8 producer threads with
  its result in Redis (Celery's defaults), each with one worker process.

    .venv/bin/python bench/run_all.py --only fast_path
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

from processes import RUN_DIR

from bench.common import (
    DB_NAME,
    MODEL_REF,
    MODEL_THREADS,
    JsonPoster,
    bench_tenant,
    embedding_service,
    model_on_its_own_cores,
    on_model_cores,
    pct,
    purge_queues,
    refusal_pause_s,
    run_nonce,
    shipped_runtime,
    wait_finished,
)
from bench.cpu import CpuMeter

SERVICE = "bench-fast-path"
# Not a renq queue: Celery declares it with its defaults (no x-max-priority).
PLAIN_QUEUE = "bench.plain-celery-noop"


def _summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {"p50_ms": round(statistics.median(ordered), 2), "p99_ms": round(pct(ordered, 99), 2)}


def raw_forward_ms(texts: list[str]) -> list[float]:
    """The engine's own forward pass of each text, alone, in this process."""
    import torch

    from inference.engines import load_engine

    torch.set_num_threads(MODEL_THREADS)
    engine = load_engine("embedding", MODEL_REF)
    for text in texts[:10]:
        engine.run_batch([{"texts": [text]}])  # warm-up
    times = []
    for text in texts:
        started = time.perf_counter()
        engine.run_batch([{"texts": [text]}])
        times.append((time.perf_counter() - started) * 1000)
    return times


def _requests(url: str, key: str, texts: list[str]) -> dict[str, list[float]]:
    """Client-observed ms per request on one keep-alive connection (JsonPoster: http.client,
    headers and body in one send): /v1/embeddings, then REST POST ?wait=, then the HTTP floor,
    GET /healthz (the client, the server and Django's request handling, no job); then
    /v1/embeddings again with `requests`, the library many clients use, which costs more on
    the client's side and sends the body after the headers."""
    import requests

    poster = JsonPoster(url, key)
    realtime = {"X-Renq-Priority": "realtime"}
    timings: dict[str, list[float]] = {
        "v1": [], "rest_wait": [], "http_floor": [], "v1_requests": []
    }  # fmt: skip

    def timed(name: str, send) -> None:
        for i, text in enumerate(texts):
            started = time.perf_counter()
            send(text)
            if i >= 10:  # warm-up excluded
                timings[name].append((time.perf_counter() - started) * 1000)

    def answered(sent: tuple[int, dict, bytes], *expected: int) -> tuple[int, dict, bytes]:
        if sent[0] not in expected:
            raise RuntimeError(f"answered {sent[0]}: {sent[2][:300]!r}")
        return sent

    def v1(text: str) -> None:
        answered(poster.post("/v1/embeddings", {"model": SERVICE, "input": text}, realtime), 200)

    def rest_wait(text: str) -> None:
        body = {"service": SERVICE, "priority": "realtime", "input": {"texts": [text]}}
        status, _, answer = answered(poster.post("/api/v1/jobs?wait=10", body), 200, 202)
        if status == 202:
            # A renq without ?wait= (the run of an earlier commit): poll every ms instead.
            job_url = f"/api/v1/jobs/{json.loads(answer)['id']}"
            while json.loads(poster.get(job_url)[2])["status"] in ("queued", "running"):
                time.sleep(0.001)

    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {key}"

    def v1_requests(text: str) -> None:
        session.post(
            f"{url}/v1/embeddings", json={"model": SERVICE, "input": text}, headers=realtime
        ).raise_for_status()

    timed("v1", v1)
    timed("rest_wait", rest_wait)
    timed("http_floor", lambda _: answered(poster.get("/healthz"), 200))
    timed("v1_requests", v1_requests)
    return timings


def _at(span: dict, key: str) -> float:
    return datetime.fromisoformat(span[key].replace("Z", "+00:00")).timestamp() * 1000


# Stage → (span whose edge starts it, edge), (span whose edge ends it, edge). The first three
# are what the answer waits for, one after another: at idle the web offers the input to the
# worker before its commit (the head start), so the pass runs beside the job's durable path,
# the rest, which the answer waits for only when the claim ends after the pass. The dispatch
# is the job's publish, or its handover to the worker that took its head start.
STAGES = [
    (
        "http in → forward starts (auth, admission, the head-start offer)",
        ("request", "start"),
        ("forward", "start"),
    ),
    ("forward pass", ("forward", "start"), ("forward", "end")),
    (
        "forward ends → answer sent (the claim if later, announce, wake, render)",
        ("forward", "end"),
        ("request", "end"),
    ),
    (
        "beside: http in → dispatch (auth, admission, INSERT + commit)",
        ("request", "start"),
        ("dispatch", "start"),
    ),
    ("beside: publish + confirm, or handover", ("dispatch", "start"), ("dispatch", "end")),
    # Delivery ends where the worker starts its claim, whatever carried the message there.
    (
        "beside: dispatch → claim starts (broker and Celery's pool, or the handover's answer)",
        ("dispatch", "start"),
        ("claim", "start"),
    ),
    ("beside: claim", ("claim", "start"), ("claim", "end")),
    (
        "beside: claim ends → forward ends (below 0: the answer waited for the claim)",
        ("claim", "end"),
        ("forward", "end"),
    ),
    ("after the answer: forward ends → stored", ("forward", "end"), ("store", "end")),
]
SPAN_NAMES = {
    "request": {"POST /v1/embeddings"},
    "dispatch": {"renq.publish", "renq.handover"},
    "claim": {"renq.claim"},
    "forward": {"renq.forward"},
    "store": {"renq.store"},
}
# A job's store ends after its answer: spans starting this long after the request ended are
# still its own (the next request comes later than that).
STORE_AFTER_ANSWER_MS = 50.0


def stage_trace(trace_file: Path) -> dict:
    """Each stage's p50/p99 over the traced requests, each with how its job was dispatched.
    A handed-over job's spans share no trace with its request, so every span is found by
    time: the requests were sequential and well apart, and each role's first span that
    starts within a request (its store, within STORE_AFTER_ANSWER_MS after) is its job's."""
    spans = [json.loads(line) for line in trace_file.read_text().splitlines() if line.strip()]
    by_role: dict[str, list[dict]] = {
        role: sorted((s for s in spans if s["name"] in names), key=lambda s: _at(s, "start_time"))
        for role, names in SPAN_NAMES.items()
    }
    stages: dict[str, list[float]] = defaultdict(list)
    dispatched: dict[str, int] = defaultdict(int)
    for request in by_role["request"]:
        begins, ends = _at(request, "start_time"), _at(request, "end_time")
        found = {"request": request}
        for role in ("dispatch", "claim", "forward", "store"):
            until = ends + (STORE_AFTER_ANSWER_MS if role == "store" else 0.0)
            found_span = next(
                (s for s in by_role[role] if begins <= _at(s, "start_time") <= until), None
            )
            if found_span is not None:
                found[role] = found_span
        if len(found) < 5:
            continue
        dispatched[found["dispatch"]["name"]] += 1
        for label, (first, first_edge), (last, last_edge) in STAGES:
            stages[label].append(
                _at(found[last], f"{last_edge}_time") - _at(found[first], f"{first_edge}_time")
            )
    return {
        "requests": len(next(iter(stages.values()), [])),
        "dispatched_by": dict(dispatched),
        "stages": {label: _summary(values) for label, values in stages.items()},
    }


def _idle_requests(key: str, texts: list[str]) -> dict:
    """The raw forward pass of `texts`, then the same texts through a web process and a worker
    (_requests): client-observed ms and overhead over the raw pass, p50/p99."""
    from processes import ProcessGroup, free_port

    from inference.dispatch.queues import service_queues

    with on_model_cores():
        forward = raw_forward_ms(texts)
    raw_ms = statistics.median(forward[10:])
    with ProcessGroup() as procs:
        url = procs.web(free_port(), workers=1)
        procs.worker("bench-fast-path", service_queues(SERVICE), threads=MODEL_THREADS)
        timings = _requests(url, key, texts)
    return {
        "raw_forward": _summary(forward[10:]),
        "v1_embeddings_client_ms": _summary(timings["v1"]),
        "rest_post_wait_client_ms": _summary(timings["rest_wait"]),
        "http_floor_client_ms": _summary(timings["http_floor"]),
        "v1_embeddings_client_ms_with_requests": _summary(timings["v1_requests"]),
        "v1_embeddings_overhead": _summary([t - raw_ms for t in timings["v1"]]),
        "rest_post_wait_overhead": _summary([t - raw_ms for t in timings["rest_wait"]]),
        "v1_embeddings_overhead_with_requests": _summary(
            [t - raw_ms for t in timings["v1_requests"]]
        ),
    }


def overhead(*, quick: bool) -> dict:
    from processes import ProcessGroup, free_port

    from inference.dispatch.queues import service_queues

    embedding_service(SERVICE)
    _, key = bench_tenant()
    purge_queues(service_queues(SERVICE))
    nonce = run_nonce()
    count = 60 if quick else 200
    texts = [f"hello world {nonce} {i}" for i in range(count + 10)]
    results: dict = {"requests": count}
    results.update(_idle_requests(key, texts))
    print(f"idle overhead over the raw forward: {results}", flush=True)
    # As on a GPU host, where the pass does not share a core with the stack: the model's
    # core to itself (the worker pins its passes there, the rest of the stack keeps off it).
    with model_on_its_own_cores():
        results["model_on_its_own_core"] = _idle_requests(key, texts)
    print(f"... with the model on its own core: {results['model_on_its_own_core']}", flush=True)

    trace_file = Path(tempfile.mkdtemp(prefix="renq-fast-path-")) / "spans.jsonl"
    traced = {"RENQ_TRACING": "1", "RENQ_TRACE_FILE": str(trace_file)}
    with ProcessGroup(env=traced) as procs:
        url = procs.web(free_port(), workers=1)
        procs.worker("bench-fast-path", service_queues(SERVICE), threads=MODEL_THREADS)
        traced_texts = [f"traced {nonce} {i}" for i in range(40 if quick else 110)]
        _requests(url, key, traced_texts)
        time.sleep(1.0)  # the last spans are written
    results["trace_with_tracing_on"] = stage_trace(trace_file)
    print(json.dumps(results["trace_with_tracing_on"], indent=2), flush=True)
    return results


def raw_batched_texts_s(texts: list[str], batch: int = 32) -> float:
    """The raw model's own throughput in batches, in this process (same threads)."""
    import torch

    from inference.engines import load_engine

    torch.set_num_threads(MODEL_THREADS)  # as the worker's passes run, whatever ran before
    engine = load_engine("embedding", MODEL_REF)
    engine.run_batch([{"texts": texts[:batch]}])  # warm-up
    started = time.perf_counter()
    for i in range(0, len(texts), batch):
        engine.run_batch([{"texts": texts[i : i + batch]}])
    return len(texts) / (time.perf_counter() - started)


def _closed_loop(clients: int, seconds: float, send) -> tuple[int, int, list[float]]:
    """`clients` threads calling `send(i)` (True: answered well) for `seconds`: (answered,
    errors, latencies in ms)."""
    lock = threading.Lock()
    answered, errors, latencies = [0], [0], []
    deadline = time.time() + seconds

    def client(k: int) -> None:
        i = 0
        while time.time() < deadline:
            started = time.perf_counter()
            ok = send(k * 10**6 + i)
            elapsed = (time.perf_counter() - started) * 1000
            i += 1
            with lock:
                latencies.append(elapsed)
                if ok:
                    answered[0] += 1
                else:
                    errors[0] += 1

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answered[0], errors[0], latencies


def _by_status(errors: dict | None) -> str:
    """' (<status> <code>: <count>, ...)' for the report, or '' when there were none."""
    if not errors:
        return ""
    return " (" + ", ".join(f"{code}: {n}" for code, n in sorted(errors.items())) + ")"


def _error_code(answer: bytes) -> str:
    """The error's code in an OpenAI-shaped error body, or '' when there is none."""
    try:
        return str(json.loads(answer)["error"].get("code") or "")
    except (ValueError, KeyError, TypeError, AttributeError):
        return ""


def model_time(jobs, since: datetime) -> dict:
    """How the model spent a run: its passes (a pass's jobs share their started_at and its
    inference_ms), the share of the run it was computing, the mean batch, and the gaps
    between one pass's end and the next one's start. A model idle between passes is fed too
    slowly: the stack's round trips, not the model, set the pace."""
    from django.db.models import Count, Max

    passes = list(
        jobs.filter(started_at__gte=since, inference_ms__isnull=False)
        .values("started_at")
        .annotate(ms=Max("inference_ms"), size=Count("id"))
        .order_by("started_at")
        .values_list("started_at", "ms", "size")
    )
    if len(passes) < 2:
        return {"passes": len(passes)}
    starts = [start.timestamp() * 1000 for start, _, _ in passes]
    ends = [start + ms for start, (_, ms, _) in zip(starts, passes, strict=True)]
    gaps = [start - end for start, end in zip(starts[1:], ends, strict=False)]
    return {
        "passes": len(passes),
        "mean_batch": round(sum(size for _, _, size in passes) / len(passes), 1),
        "model_busy_share": round(sum(ms for _, ms, _ in passes) / (ends[-1] - starts[0]), 3),
        "gap_between_passes_ms": _summary(gaps),
    }


def under_load(*, quick: bool) -> dict:
    """Single-text jobs at 2 shared cores (unpinned, as the README runs it): 8 REST clients
    submitting single jobs, succeeded jobs/s against the raw model batched (the final
    statuses beside it); then 16 keep-alive clients on /v1/embeddings, answers/s and p99
    against the service's total_timeout."""
    from django.db.models import Count
    from processes import ProcessGroup, free_port

    from inference.config.changes import config_recheck_s
    from inference.dispatch.queues import service_queues
    from inference.intake.overdue import CHECK_REUSE_S, OVERDUE_HOLD_MS
    from inference.models import Job

    service = embedding_service(SERVICE)
    _, key = bench_tenant()
    purge_queues(service_queues(SERVICE))
    nonce = run_nonce()
    seconds = 5.0 if quick else 15.0
    raw = raw_batched_texts_s([f"raw {nonce} {i}" for i in range(640)])
    results: dict = {"seconds": seconds, "raw_batched_texts_s": round(raw, 1)}
    with ProcessGroup() as procs:
        url = procs.web(free_port(), workers=2)
        procs.worker("bench-fast-path", service_queues(SERVICE), threads=MODEL_THREADS)
        poster = JsonPoster(url, key)
        poster.post("/api/v1/jobs", {"service": SERVICE, "input": {"texts": ["warm"]}})
        jobs = Job.objects.filter(service=service)

        def rest_clients(*, honour_retry_after: bool) -> dict:
            before = jobs.count()
            started = time.time()

            def rest(i: int) -> bool:
                body = {"service": SERVICE, "input": {"texts": [f"rest {nonce} {i}"]}}
                status, headers, _ = poster.post("/api/v1/jobs", body)
                if status in (429, 503) and honour_retry_after:
                    time.sleep(refusal_pause_s(headers))
                return status == 202

            submitted, refused, _ = _closed_loop(8, seconds, rest)
            wait_finished(jobs, before + submitted, timeout_s=300)
            # Done means succeeded: a job that outlived its queue_timeout is final too, but
            # nobody got its embedding (the flood outruns the model, the backlog expires).
            run_jobs = jobs.filter(created_at__gte=datetime.fromtimestamp(started, UTC))
            statuses = dict(run_jobs.values_list("status").annotate(n=Count("id")))
            last = run_jobs.filter(status="succeeded").order_by("-finished_at").first()
            succeeded_s = statuses.get("succeeded", 0) / (last.finished_at.timestamp() - started)
            return {
                "jobs": submitted,
                "refused": refused,
                "statuses": statuses,
                "completed_jobs_s": round(succeeded_s, 1),
                "vs_raw_batched": round(succeeded_s / raw, 3),
                "model": model_time(jobs, datetime.fromtimestamp(started, UTC)),
            }

        results["rest_8_clients"] = rest_clients(honour_retry_after=False)
        # The same with clients that wait out a 503's Retry-After (a tenant's line claimed
        # late is refused, inference.intake.overdue), as renq_client and the SDKs do.
        results["rest_8_clients_retry_after"] = rest_clients(honour_retry_after=True)
        # As config.yaml ships the queue (max_queue_size; only the rate limit lifted), with
        # clients that wait out a 503's Retry-After as a well-behaved client does.
        embedding_service(SERVICE, max_queue_size=shipped_runtime("embedding")["max_queue_size"])
        time.sleep(config_recheck_s() + 0.5)  # every web process has read it
        results["rest_8_clients_shipped_queue"] = rest_clients(honour_retry_after=True)
        rest_jobs_s = max(
            results[k]["completed_jobs_s"]
            for k in (
                "rest_8_clients",
                "rest_8_clients_retry_after",
                "rest_8_clients_shipped_queue",
            )
        )
        # The same client as the REST clients' (a connection per thread), so that the two
        # figures compare the front doors, not the client libraries.

        refusals: Counter = Counter()

        def v1(i: int) -> bool:
            body = {"model": SERVICE, "input": f"v1 {nonce} {i}"}
            status, _, answer = poster.post("/v1/embeddings", body)
            if status != 200:
                refusals[f"{status} {_error_code(answer)}".strip()] += 1
            return status == 200

        # A REST flood's last late claims can leave the tenant's api line marked overdue for
        # OVERDUE_HOLD_MS (inference.intake.overdue): the /v1 run starts once such a mark has
        # lapsed, not refused for the tail of the run before it.
        time.sleep((OVERDUE_HOLD_MS / 1000 + CHECK_REUSE_S) * 2)
        v1_started = datetime.now(UTC)
        answered, errors, latencies = _closed_loop(16, seconds, v1)
        results["v1_16_clients"] = {
            "answered": answered,
            "errors": errors,
            "errors_by_status": dict(refusals),
            "answers_s": round(answered / seconds, 1),
            "p50_ms": round(pct(latencies, 50), 1),
            "p99_ms": round(pct(latencies, 99), 1),
            "total_timeout_ms": service.total_timeout * 1000,
            # Against the best of the REST runs.
            "vs_rest_8_clients": round(answered / seconds / rest_jobs_s, 3),
            "model": model_time(jobs, v1_started),
        }
    print(f"under load: {results}", flush=True)
    return results


def under_backlog(*, quick: bool) -> dict:
    """Realtime answers while the worker drains a batch backlog: one /v1/embeddings request
    every 50 ms (`X-Renq-Priority: realtime`, a keep-alive connection) while 100-job batch-tier
    POSTs keep the queue growing; client-observed p50/p99. A realtime job waits for the
    batch pass already running (passes are not preempted), then runs first."""
    import requests
    from processes import ProcessGroup, free_port

    from inference.dispatch.queues import service_queues
    from inference.models import Job

    service = embedding_service(SERVICE)
    _, key = bench_tenant()
    purge_queues(service_queues(SERVICE))
    nonce = run_nonce()
    seconds = 10.0 if quick else 25.0
    with ProcessGroup() as procs:
        url = procs.web(free_port(), workers=1)
        procs.worker("bench-fast-path", service_queues(SERVICE), threads=MODEL_THREADS)
        poster = JsonPoster(url, key)
        session = requests.Session()
        session.headers.update({"Authorization": f"Bearer {key}", "X-Renq-Priority": "realtime"})

        def realtime(i: int) -> requests.Response:
            body = {"model": SERVICE, "input": f"rt {nonce} {i}"}
            return session.post(f"{url}/v1/embeddings", json=body)

        for i in range(10):
            realtime(-1 - i)  # warm-up
        stop = time.time() + seconds
        refused = [0]

        def flood() -> None:
            i = 0
            while time.time() < stop:
                body = [
                    {"service": SERVICE, "priority": "batch", "input": {"texts": [text]}}
                    for text in (f"batch {nonce} {i} {k} a few more words" for k in range(100))
                ]
                if poster.post("/api/v1/jobs", body)[0] != 202:
                    refused[0] += 1
                i += 1
                time.sleep(0.2)

        flooding = threading.Thread(target=flood)
        flooding.start()
        time.sleep(min(3.0, seconds / 4))  # a backlog first
        latencies, errors = [], 0
        while time.time() < stop - 1:
            started = time.perf_counter()
            if realtime(len(latencies) + errors).status_code == 200:
                latencies.append((time.perf_counter() - started) * 1000)
            else:
                errors += 1
            time.sleep(0.05)
        flooding.join()
        backlog = Job.objects.filter(service=service, status="queued").count()
    results = {
        "seconds": seconds,
        "requests": len(latencies),
        "errors": errors,
        "batch_posts_refused": refused[0],
        "backlog_at_end": backlog,
        "realtime_client_ms": _summary(latencies),
    }
    print(f"realtime under a batch backlog: {results}", flush=True)
    purge_queues(service_queues(SERVICE))
    return results


def _plain_queue_depth(name: str) -> int:
    from bench.plain_celery import app

    with app.connection_for_write() as conn:
        return conn.default_channel.queue_declare(queue=name, passive=True).message_count


def plain_celery_noop(*, quick: bool) -> dict:
    """apply_async of a no-op task from 8 threads of a producer process, one prefork worker,
    results in Redis, all with Celery's defaults (bench.plain_celery): CPU per task by
    process."""
    from processes import VENV_BIN, ProcessGroup, wait_until

    seconds = 3.0 if quick else 10.0
    # The producer exits before the meter stops: its CPU is what this process reaps of it.
    reaped = resource.getrusage(resource.RUSAGE_CHILDREN)
    with ProcessGroup() as procs:
        worker = [str(VENV_BIN / "celery"), "-A", "bench.plain_celery", "worker", "-l", "info"]
        options = ["-Q", PLAIN_QUEUE, "-c", "1", "-n", "bench-plain-noop@%h", "--purge"]
        worker_log = procs.start("bench-plain-noop", worker + options)
        wait_until(lambda: " ready." in worker_log.read_text(), "plain Celery worker")
        procs.start(
            "plain-producer",
            [sys.executable, "bench/plain_producer.py", "8", str(seconds), PLAIN_QUEUE],
        )
        producer, consumer = procs.procs["plain-producer"], procs.procs["bench-plain-noop"]
        meter = CpuMeter(DB_NAME, {"web": producer.pid, "worker": consumer.pid})
        meter.start()
        started = time.time()
        producer.wait(timeout=seconds + 120)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        producer_s = (after.ru_utime - reaped.ru_utime) + (after.ru_stime - reaped.ru_stime)
        # A prefetched task has left the queue but may still run: wait for the last result.
        while _plain_queue_depth(PLAIN_QUEUE) > 0 and time.time() - started < 300:
            time.sleep(0.2)
        time.sleep(1.0)
        cpu = meter.stop()
        span_s = time.time() - started
    log = (RUN_DIR / "plain-producer.log").read_text()
    sent = int(log.strip().splitlines()[-1])
    cpu["web_s"] = producer_s  # the "web" role is the producer process here
    roles = ("web", "worker", "postgres", "rabbitmq", "redis")
    stack_s = sum(cpu[f"{role}_s"] for role in roles)
    return {
        "tasks": sent,
        "tasks_s": round(sent / span_s, 1),
        "cpu_ms_per_task": round(1000 * stack_s / max(1, sent), 3),
        "cpu_ms_per_task_by_role": {
            ("producer" if role == "web" else role): round(1000 * cpu[f"{role}_s"] / sent, 3)
            for role in roles
        },
    }


def cpu_against_plain_celery(*, quick: bool) -> dict:
    from bench import noop_throughput

    renq = noop_throughput.run(quick=quick, web_workers=1)
    plain = plain_celery_noop(quick=quick)
    single = renq["single"]["cpu_ms_per_job"]
    batched = renq["batched"]["cpu_ms_per_job"] if "batched" in renq else None
    results = {
        "renq_single_job_posts": renq["single"],
        "renq_100_per_post": renq.get("batched"),
        "plain_celery_noop": plain,
        "renq_single_vs_plain_cpu": round(single / plain["cpu_ms_per_task"], 3),
        "renq_100_per_post_vs_single_cpu": round(batched / single, 3) if batched else None,
    }
    print(
        f"CPU ms/job: renq single {single:.2f}, 100/POST {batched}, plain Celery "
        f"{plain['cpu_ms_per_task']:.2f} ({results['renq_single_vs_plain_cpu']}x)",
        flush=True,
    )
    return results


def run(*, quick: bool) -> dict:
    from bench import results_read

    return {
        "overhead": overhead(quick=quick),
        "under_load": under_load(quick=quick),
        # Issue 29's "100 jobs per POST": a client that submits them and reads them back.
        "hundred_per_post": results_read.run(jobs=1000 if quick else 3000),
        "under_backlog": under_backlog(quick=quick),
        "cpu": cpu_against_plain_celery(quick=quick),
    }


def _model_row(name: str, m: dict) -> str:
    gaps = m.get("gap_between_passes_ms") or {}
    return (
        f"| {name} | {m['passes']} | {m.get('mean_batch', '—')} | "
        f"{m.get('model_busy_share', '—')} | {gaps.get('p50_ms', '—')} / "
        f"{gaps.get('p99_ms', '—')} |"
    )


def report_lines(r: dict) -> list[str]:
    """The README section: overhead, the idle trace, CPU against plain Celery."""
    o, c = r["overhead"], r["cpu"]
    raw = o["raw_forward"]
    pinned = o.get("model_on_its_own_core")
    alone = (
        f" (on the model's own core: p50 {pinned['raw_forward']['p50_ms']} ms)" if pinned else ""
    )
    lines = [
        "## The realtime fast path (issue 29)",
        "",
        f"Idle, one short text, realtime, {o['requests']} sequential requests on a keep-alive "
        f"connection (http.client, headers and body in one send); the raw forward pass of the "
        f"same texts in this process: p50 {raw['p50_ms']} ms, p99 {raw['p99_ms']} ms{alone}. "
        "Shared cores: as the README runs it, the pass shares two cores with the stack's work "
        "for the same request; model on its own core: as on a GPU host.",
        "",
        "| request | client p50 | client p99 | overhead p50 | overhead p99 | target |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for label, key in (
        ("POST /v1/embeddings", "v1_embeddings"),
        ("POST /api/v1/jobs?wait=", "rest_post_wait"),
    ):
        for where, figures in (("shared cores", o), ("model on its own core", pinned)):
            if figures is None:
                continue
            client, over = figures[f"{key}_client_ms"], figures[f"{key}_overhead"]
            lines.append(
                f"| {label}, {where} | {client['p50_ms']} | {client['p99_ms']} | "
                f"{over['p50_ms']} | {over['p99_ms']} | ≤ 5 / ≤ 15 ms |"
            )
    if "http_floor_client_ms" in o:
        floor = o["http_floor_client_ms"]
        lines.append(
            f"| GET /healthz, no job (the client library, the server, Django) | "
            f"{floor['p50_ms']} | {floor['p99_ms']} | | | the floor under both |"
        )
    if "v1_embeddings_client_ms_with_requests" in o:
        client = o["v1_embeddings_client_ms_with_requests"]
        over = o["v1_embeddings_overhead_with_requests"]
        lines.append(
            f"| POST /v1/embeddings, `requests` as the client | {client['p50_ms']} | "
            f"{client['p99_ms']} | {over['p50_ms']} | {over['p99_ms']} | |"
        )
    trace = o["trace_with_tracing_on"]
    lines += [
        "",
        f"The idle trace ({trace['requests']} /v1 requests, tracing on: every stage pays for "
        f"its spans too; dispatched by {trace.get('dispatched_by', {})}):",
        "",
        "| stage | p50 ms | p99 ms |",
        "|---|---:|---:|",
    ]
    lines += [f"| {s} | {v['p50_ms']} | {v['p99_ms']} |" for s, v in trace["stages"].items()]
    if "under_load" in r:
        u = r["under_load"]
        rest, v1 = u["rest_8_clients"], u["v1_16_clients"]
        lines += [
            "",
            f"Under load, single-text jobs, 2 web processes and one worker on the shared cores "
            f"(unpinned), {u['seconds']:.0f} s each; the raw model batched: "
            f"{u['raw_batched_texts_s']} texts/s.",
            "",
            "| clients | succeeded/s | vs raw batched | errors | p50 / p99 ms |",
            "|---|---:|---:|---:|---|",
            f"| 8 REST, single-job POSTs, queue lifted, refusals retried at once (final "
            f"statuses: {rest.get('statuses', '—')}) | {rest['completed_jobs_s']} | "
            f"{rest['vs_raw_batched']} × (target ≥ 0.5) | {rest['refused']} refused | — |",
            *(
                f"| 8 REST, single-job POSTs, queue lifted, Retry-After waited out (final "
                f"statuses: {waited['statuses']}) | {waited['completed_jobs_s']} | "
                f"{waited['vs_raw_batched']} × | {waited['refused']} refused | — |"
                for waited in [u.get("rest_8_clients_retry_after")]
                if waited
            ),
            *(
                f"| 8 REST, single-job POSTs, config.yaml's max_queue_size, Retry-After waited "
                f"out (final statuses: {shipped['statuses']}) | {shipped['completed_jobs_s']} | "
                f"{shipped['vs_raw_batched']} × | {shipped['refused']} refused | — |"
                for shipped in [u.get("rest_8_clients_shipped_queue")]
                if shipped
            ),
            f"| 16 keep-alive /v1/embeddings | {v1['answers_s']} | "
            f"{round(v1['answers_s'] / u['raw_batched_texts_s'], 3)} × | {v1['errors']}"
            f"{_by_status(v1.get('errors_by_status'))} | "
            f"{v1['p50_ms']} / {v1['p99_ms']} (total_timeout {v1['total_timeout_ms']:.0f}) |",
            "",
            f"16 /v1 clients against 8 REST clients (the best REST run): "
            f"**{v1['vs_rest_8_clients']}×** (target ≥ 1).",
            "",
            "How the model spent each run (its passes from the jobs' rows; a model idle between "
            "passes waits on the stack):",
            "",
            "| run | passes | mean batch | model busy | gap between passes p50 / p99 ms |",
            "|---|---:|---:|---:|---|",
            *(
                _model_row(name, run["model"])
                for name, run in (
                    ("8 REST, refusals retried at once", rest),
                    ("8 REST, Retry-After waited out", u.get("rest_8_clients_retry_after")),
                    ("8 REST, config.yaml's queue", u.get("rest_8_clients_shipped_queue")),
                    ("16 /v1", v1),
                )
                if run and "model" in run
            ),
        ]
    if "hundred_per_post" in r:
        h = r["hundred_per_post"]
        lines += [
            "",
            f"100 jobs per POST, read back as they finish (`bench/results_read.py`: "
            f"{h['jobs']} single-text jobs through renq_client's bulk() then results(), one web "
            f"process and one worker on the shared cores): {h['texts_s']} texts/s against the "
            f"raw model's {h['raw_batched_texts_s']}, **{h['vs_raw_batched']}×** (target ≥ "
            f"0.9); {h['client_requests']} requests, stack CPU {h['stack_cpu_ms_per_job']} ms "
            f"per job ({h['cpu_ms_per_job']}).",
        ]
    if "under_backlog" in r:
        b = r["under_backlog"]
        lines += [
            "",
            f"Realtime under a batch backlog ({b['backlog_at_end']} batch jobs still queued at "
            f"the end): one /v1/embeddings request every 50 ms, {b['requests']} answered, "
            f"{b['errors']} errors: p50 {b['realtime_client_ms']['p50_ms']} ms, p99 "
            f"{b['realtime_client_ms']['p99_ms']} ms (a realtime job waits for the batch pass "
            "already running).",
        ]
    single, plain = c["renq_single_job_posts"], c["plain_celery_noop"]
    lines += [
        "",
        "CPU per no-op job, side by side (one worker process each):",
        "",
        "| | jobs/s | CPU ms/job | by process |",
        "|---|---:|---:|---|",
        f"| renq, one job per POST | {single['completed_jobs_s']:.0f} | "
        f"{single['cpu_ms_per_job']:.2f} | {single['cpu_ms_per_job_by_role']} |",
    ]
    if c.get("renq_100_per_post"):
        batched = c["renq_100_per_post"]
        lines.append(
            f"| renq, 100 jobs per POST | {batched['completed_jobs_s']:.0f} | "
            f"{batched['cpu_ms_per_job']:.2f} | {batched['cpu_ms_per_job_by_role']} |"
        )
    lines += [
        f"| plain Celery: apply_async + no-op task + result in Redis | {plain['tasks_s']:.0f} | "
        f"{plain['cpu_ms_per_task']:.2f} | {plain['cpu_ms_per_task_by_role']} |",
        "",
        f"renq single-job POST / plain Celery task: **{c['renq_single_vs_plain_cpu']}×** "
        f"(target ≤ 1); 100 per POST / single: **{c['renq_100_per_post_vs_single_cpu']}×** "
        "(target ≤ 0.25).",
    ]
    return lines
