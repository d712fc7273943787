"""`make bench`: every figure of issues 9 and 8 from one run, as ratios and distributions
measured in that run; results go to bench/results/ (README.md, results.json, PNG plots,
submit_profile.txt). Scenarios, in order:

- inprocess: the raw model (one by one, batched) vs renq's batch former, alone and as the
  pipelined loop runs it (bench/inprocess_pipeline.py); the model beside a thread running
  Python, traced and eager; padding saved by length bucketing;
- e2e: plain Celery (one task per job) vs renq's worker drain vs renq end to end over REST;
  idle realtime scheduler overhead (config.yaml's embedding settings); latency vs throughput
  for several (batch_size, batch_timeout);
- noop: the stack's own cost with the no-op model: jobs/s and CPU ms per job by process, one
  job per POST and 100 per POST (bench/noop_throughput.py);
- tracing: CPU ms per job with OpenTelemetry tracing off and on, every span exported over
  OTLP (bench/tracing_cost.py, no-op model);
- profile: pyinstrument profile of single-job POSTs in-process (bench/submit_profile.py);
- bulk: a 10,000-text bulk job vs the raw model (bench/bulk.py);
- priority: saturation with P0-P3 traffic, with and without the preemption budget, and two
  tenants of one tier (bench/priority.py);
- tenants: fairness between tenants inside a tier (issue 27): quiet tenants beside a flood,
  throughput vs the flood alone, Jain's index, a free realtime flood beside pro api jobs
  (bench/tenants.py, no-op model);
- fast_path: the realtime fast path (issue 29): idle overhead of /v1/embeddings and REST
  POST ?wait= over the raw forward pass, the idle trace stage by stage, CPU per no-op job
  against plain Celery, 100 jobs per POST read back by renq_client (bench/fast_path.py);
- result_bytes: bytes per embedding job stored, sent and answered, JSON floats vs float32
  (bench/result_bytes.py; results.json only);
- llm: LLM serving with continuous batching (issue 31): completion tokens/s of concurrent
  /v1/completions vs the raw model's static generate(), realtime TTFT at idle and beside an
  offline load, inter-token latency, rows in flight (bench/llm_serving.py; device auto).

The bench has its own database (renq_bench), queue prefix (bench.) and Redis dbs (5, 6).

Usage: python bench/run_all.py [--jobs 600] [--quick] [--only noop,priority] [--results-dir DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import django  # noqa: E402

from bench import common  # noqa: E402, F401  (points this process at the bench's own stores)

django.setup()

import requests  # noqa: E402
import torch  # noqa: E402
from django.conf import settings  # noqa: E402
from django.utils import timezone  # noqa: E402
from processes import CONTROL_WORKER_OPTIONS, ProcessGroup, free_port  # noqa: E402

from bench import (  # noqa: E402
    bulk,
    fast_path,
    inprocess_pipeline,
    llm_serving,
    noop_throughput,
    priority,
    result_bytes,
    submit_profile,
    tenants,
    tracing_cost,
)
from bench.common import (  # noqa: E402
    MODEL_REF,
    MODEL_THREADS,
    bench_tenant,
    embedding_service,
    mixed_texts,
    pct,
    purge_queues,
    refusal_pause_s,
    run_nonce,
    short_texts,
)
from bench.report import plot, write_report  # noqa: E402
from inference.dispatch.publishing import publish  # noqa: E402
from inference.dispatch.queues import control_queue, service_queues  # noqa: E402
from inference.engines import load_engine  # noqa: E402
from inference.models import Job, Service, Tenant  # noqa: E402
from inference.scheduling.batch_window import BatchItem, BatchWindow  # noqa: E402
from inference.scheduling.bucketing import padding_stats, plan_length_buckets  # noqa: E402
from renq_site.celery import app  # noqa: E402

SERVICE = "bench-embed"  # the historical e2e/drain/settings runs: batch 32, long timeouts
IDLE_SERVICE = bulk.SERVICE  # config.yaml's embedding settings (the CPU profile)
CLIENTS = 8
SCENARIOS = (
    "inprocess",
    "e2e",
    "pools",
    "noop",
    "tracing",
    "profile",
    "bulk",
    "priority",
    "tenants",
    "fast_path",
    "result_bytes",
    "llm",
)
# The Celery worker pools compared for the GPU worker (idle realtime latency, one process each).
POOLS = ("prefork", "solo", "threads")


# --- in-process: the raw model and the batch former without a broker ----------------------


def bench_raw(engine, texts: list[str], batch: int, rounds: int = 3) -> dict:
    # Untimed first: a fresh process's first batches run slower (its allocator has not yet
    # kept the activations' memory), and the worker the bench compares with is warm.
    inprocess_pipeline.raw_rate(engine, texts, batch)
    t0 = time.perf_counter()
    for text in texts:
        engine.run_batch([{"texts": [text]}])
    one_by_one = len(texts) / (time.perf_counter() - t0)
    # The best of a few runs: the reference renq is held to is the model at its fastest.
    batched = max(inprocess_pipeline.raw_rate(engine, texts, batch) for _ in range(rounds))
    # The renq batch former in front of the same model (no broker, no database).
    t0 = time.perf_counter()
    pending = list(texts)
    while pending:
        window: BatchWindow[str] = BatchWindow(max_jobs=batch, timeout_s=0.01, max_tokens=16384)
        while pending and window.offer(
            BatchItem(pending[0], engine.count_tokens({"texts": [pending[0]]}))
        ):
            pending.pop(0)
        engine.run_batch([{"texts": [t]} for t in window.values()])
    former = len(texts) / (time.perf_counter() - t0)
    return {
        "one_by_one_texts_s": one_by_one,
        "batched_texts_s": batched,
        "batch_former_texts_s": former,
        "batch": batch,
        "n": len(texts),
    }


def bench_beside_python(engine, texts: list[str], batch: int) -> dict:
    """The model's batched rate while another thread runs Python on the other cores, as the
    worker's forward passes run beside its loop: with the engine's traced forward pass and
    with the eager model it was traced from (inference.engines.traced)."""
    def rate() -> float:
        stop = threading.Event()

        def spin() -> None:
            os.sched_setaffinity(0, common.STACK_CPUS)  # this thread only (Linux)
            while not stop.is_set():
                sum(range(1000))

        spinner = threading.Thread(target=spin)
        spinner.start()
        try:
            return inprocess_pipeline.raw_rate(engine, texts, batch)
        finally:
            stop.set()
            spinner.join()

    traced = rate()
    graph, engine.forward.graph = engine.forward.graph, None
    try:
        eager = rate()
    finally:
        engine.forward.graph = graph
    return {"traced_texts_s": traced, "eager_texts_s": eager, "batch": batch, "n": len(texts)}


def bench_padding(engine, texts: list[str], batch: int) -> dict:
    lengths = [engine.count_tokens({"texts": [t]}) for t in texts]
    arrival = [list(range(i, min(i + batch, len(texts)))) for i in range(0, len(texts), batch)]
    computed_plain, useful = padding_stats(lengths, arrival)
    computed_bucketed = 0
    for group in arrival:
        sub = plan_length_buckets([lengths[i] for i in group], max_padding_ratio=0.25)
        computed_bucketed += padding_stats([lengths[i] for i in group], sub)[0]
    timings = {}
    for label, ratio in (("one_padded_batch", 1.0), ("bucketed", 0.25)):
        engine.max_padding_ratio = ratio
        t0 = time.perf_counter()
        for group in arrival:
            engine.run_batch([{"texts": [texts[i]]} for i in group])
        timings[label] = time.perf_counter() - t0
    engine.max_padding_ratio = 0.25
    return {
        "useful_tokens": useful,
        "computed_one_padded_batch": computed_plain,
        "computed_bucketed": computed_bucketed,
        "padding_saved_pct": 100 * (1 - (computed_bucketed - useful) / (computed_plain - useful)),
        "seconds_one_padded_batch": timings["one_padded_batch"],
        "seconds_bucketed": timings["bucketed"],
    }


# --- end to end over REST, RabbitMQ, Postgres and a real worker ----------------------------


class Bench:
    def __init__(self, procs: ProcessGroup, url: str, key: str, service: Service, tenant):
        self.procs, self.url, self.service, self.tenant = procs, url, service, tenant
        self.headers = {"Authorization": f"Bearer {key}"}
        self.poster = common.JsonPoster(url, key)
        self.local = threading.local()
        self.lock = threading.Lock()
        self.refused: Counter = Counter()  # 429/503 answers, waited out and retried

    def session(self) -> requests.Session:
        """For reads outside the measured spans (POSTs go through `poster`)."""
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
            self.local.session.headers.update(self.headers)
        return self.local.session

    def submit(self, text: str, priority: str = "api", service: str = SERVICE) -> str:
        """One job; a 429/503 is waited out as it says (and counted)."""
        body = {"service": service, "priority": priority, "input": {"texts": [text]}}
        for _ in range(30):
            status, headers, answer = self.poster.post("/api/v1/jobs", body)
            if status not in (429, 503):
                break
            with self.lock:
                self.refused[status] += 1
            time.sleep(refusal_pause_s(headers))
        if status != 202:
            raise RuntimeError(f"POST /api/v1/jobs answered {status}: {answer[:500]!r}")
        return json.loads(answer)["id"]

    def configure(self, **runtime) -> None:
        Service.objects.filter(pk=self.service.pk).update(**runtime)

    def wait_all(self, ids: list[str], timeout_s: float = 600) -> list[Job]:
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            done = Job.objects.filter(pk__in=ids, finished_at__isnull=False).count()
            if done == len(ids):
                break
            time.sleep(0.1)
        return list(Job.objects.filter(pk__in=ids))

    def closed_loop(self, texts: list[str]) -> tuple[list[Job], float, float]:
        """(jobs, seconds until the last result, seconds until the last 202)."""
        t0 = time.time()
        with ThreadPoolExecutor(CLIENTS) as pool:
            ids = list(pool.map(self.submit, texts))
        submitted_s = time.time() - t0
        jobs = self.wait_all(ids)
        return jobs, _span(jobs, t0), submitted_s

    def drain(self, texts: list[str], start_worker) -> tuple[list[Job], float]:
        """The worker alone: the same jobs as plain Celery's, published straight to RabbitMQ
        while no worker consumes, then drained by one started after (`start_worker`): the
        worker path (claim, tier pull, batch, store) without the web tier or a publisher
        beside it. Span: its first claim to its last finish."""
        rows = Job.objects.bulk_create(
            Job(tenant=self.tenant, service=self.service, tier="api", input={"texts": [t]})
            for t in texts
        )
        for job in rows:
            publish(job)
        start_worker()
        jobs = self.wait_all([str(j.pk) for j in rows])
        first_claim = min(j.claimed_at.timestamp() for j in jobs if j.claimed_at)
        return jobs, _span(jobs, first_claim)

    def open_loop(self, texts: list[str], rate: float) -> tuple[list[Job], float]:
        """Submit at a fixed offered rate (jobs/s) from CLIENTS threads."""
        t0 = time.time()
        ids: list[str] = []
        lock = threading.Lock()

        def client(k: int) -> None:
            for i in range(k, len(texts), CLIENTS):
                delay = t0 + i / rate - time.time()
                if delay > 0:
                    time.sleep(delay)
                job_id = self.submit(texts[i])
                with lock:
                    ids.append(job_id)

        threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        jobs = self.wait_all(ids)
        return jobs, _span(jobs, t0)

    def idle_latency(self, n: int) -> dict:
        """Sequential realtime jobs on an idle worker, on the service with config.yaml's
        embedding settings. Texts are unique to the run (no cache answers)."""
        nonce = run_nonce()
        client_ms, waits, infer, overhead = [], [], [], []
        stages: dict[str, list[float]] = {"to_claim": [], "claim_to_start": [], "after_pass": []}
        for i in range(n + 5):
            t0 = time.perf_counter()
            job_id = self.submit(f"idle probe {nonce} {i}", "realtime", IDLE_SERVICE)
            # Poll Postgres (one PK lookup per 2 ms), not the web server: HTTP polling at this
            # rate would load the one web process and inflate the latency it measures.
            while not Job.objects.filter(pk=job_id, finished_at__isnull=False).exists():
                time.sleep(0.002)
            elapsed_ms = (time.perf_counter() - t0) * 1000
            body = self.session().get(f"{self.url}/api/v1/jobs/{job_id}", timeout=10).json()
            if i >= 5:  # the first few warm the web process and the worker's caches
                client_ms.append(elapsed_ms)
                waits.append(body["queue_wait_ms"])
                infer.append(body["inference_ms"])
                overhead.append(body["total_ms"] - body["inference_ms"])
                # Where the overhead goes, from the job's own timestamps.
                job = Job.objects.get(pk=job_id)
                stages["to_claim"].append(ms_between(job.created_at, job.claimed_at))
                stages["claim_to_start"].append(ms_between(job.claimed_at, job.started_at))
                stages["after_pass"].append(
                    ms_between(job.started_at, job.finished_at) - body["inference_ms"]
                )
            time.sleep(0.05)
        return {
            "n": n,
            "service": IDLE_SERVICE,
            "client_e2e_ms_p50": statistics.median(client_ms),
            "queue_wait_ms_p50": statistics.median(waits),
            "inference_ms_p50": statistics.median(infer),
            "scheduler_overhead_ms_p50": statistics.median(overhead),
            "scheduler_overhead_ms_p95": pct(overhead, 95),
            "scheduler_overhead_ms_p99": pct(overhead, 99),
            "scheduler_overhead_ms_max": max(overhead),
            # created → claimed (commit, publish, delivery, task start, claim), claimed →
            # forward pass started (batch formation, tokenizing), after the pass (storing).
            "stages_ms_p50": {name: statistics.median(v) for name, v in stages.items()},
        }


def ms_between(earlier, later) -> float:
    return (later - earlier).total_seconds() * 1000


def _span(jobs: list[Job], t0: float) -> float:
    return max(j.finished_at.timestamp() for j in jobs) - t0


def latency_stats(jobs: list[Job], span_s: float) -> dict:
    lat = [(j.finished_at - j.created_at).total_seconds() * 1000 for j in jobs]
    ok = [j for j in jobs if j.status == "succeeded"]
    return {
        "jobs": len(jobs),
        "succeeded": len(ok),
        "throughput_jobs_s": len(ok) / span_s,
        "p50_ms": pct(lat, 50),
        "p95_ms": pct(lat, 95),
        "p99_ms": pct(lat, 99),
        "batch_hist": dict(sorted(Counter(j.batch_size or 0 for j in ok).items())),
    }


def setup_rows() -> tuple[Service, Tenant, str]:
    service, _ = Service.objects.update_or_create(
        name=SERVICE,
        defaults=dict(
            kind="embedding",
            model_ref=MODEL_REF,
            batch_size=32,
            batch_timeout=0.01,
            max_queue_size=100_000,
            queue_timeout=600,
            inference_timeout=60,
            total_timeout=600,
            rate_limit=0,
            enable_cache=False,
            max_total_tokens=16384,
            preemption_budget_s=None,
        ),
    )
    embedding_service(IDLE_SERVICE)
    tenant, key = bench_tenant()
    return service, tenant, key


# --- scenarios ------------------------------------------------------------------------------


def scenario_inprocess(results: dict, engine, quick: bool) -> None:
    print("== in-process: raw model vs batch former (no broker)", flush=True)
    texts = short_texts(128 if quick else 256, seed=3)
    with common.on_model_cores():
        results["raw"] = bench_raw(engine, texts, 32, rounds=1 if quick else 3)
        print(results["raw"], flush=True)
        results["beside_python"] = bench_beside_python(engine, texts, 32)
        print(results["beside_python"], flush=True)
        results["padding"] = bench_padding(engine, mixed_texts(64 if quick else 128), 32)
    print(results["padding"], flush=True)
    # The loop's threads where the worker's run (off the model's cores), its model thread on
    # them.
    results["pipeline"] = inprocess_pipeline.compare(
        engine, texts, 32, rounds=1 if quick else 3, pin_model_thread=common.pin_to_model_cores
    )
    print(results["pipeline"], flush=True)


def scenario_e2e(results: dict, n_jobs: int, quick: bool) -> None:
    """Plain Celery, idle latency, worker drain, e2e over REST, latency vs throughput: one web
    process, the model on MODEL_THREADS."""
    service, tenant, key = setup_rows()
    purge_queues(service_queues(SERVICE) + service_queues(IDLE_SERVICE) + ["bench.plain"])
    texts = short_texts(n_jobs)
    with ProcessGroup() as procs:
        url = procs.web(free_port(), workers=1)
        bench = Bench(procs, url, key, service, tenant)

        n_plain = max(100, n_jobs // 2)
        print(f"== plain Celery: one task per job, no batching ({n_plain} jobs)", flush=True)
        rows = Job.objects.bulk_create(
            Job(tenant=tenant, service=service, tier="api", input={"texts": [t]})
            for t in texts[:n_plain]
        )
        # As the drain below: published first, then one worker drains them alone.
        for job in rows:
            app.send_task("bench.plain_embed", args=[str(job.pk)], queue="bench.plain")
        procs.worker(
            "bench-plain",
            ["bench.plain"],
            threads=MODEL_THREADS,
            extra=["-I", "bench.plain_tasks"],
        )
        plain_jobs = bench.wait_all([str(j.pk) for j in rows])
        first_start = min(j.started_at.timestamp() for j in plain_jobs if j.started_at)
        results["plain_celery"] = latency_stats(plain_jobs, _span(plain_jobs, first_start))
        print(results["plain_celery"], flush=True)
        procs.stop_one("bench-plain")

        def start_renq_worker() -> None:
            procs.worker(
                "bench-renq",
                service_queues(SERVICE) + service_queues(IDLE_SERVICE),
                threads=MODEL_THREADS,
            )

        start_renq_worker()
        print(f"== renq idle latency (realtime, sequential, {IDLE_SERVICE})", flush=True)
        results["idle"] = bench.idle_latency(30 if quick else 100)
        print(results["idle"], flush=True)

        print(
            f"== renq worker drain: {n_jobs} jobs queued in RabbitMQ, then one worker", flush=True
        )
        procs.stop_one("bench-renq")
        jobs, span = bench.drain(short_texts(n_jobs, seed=5), start_renq_worker)
        results["renq_drain"] = latency_stats(jobs, span)
        print(results["renq_drain"], flush=True)

        print(f"== renq e2e: {n_jobs} single jobs over REST from {CLIENTS} clients", flush=True)
        jobs, span, submitted_s = bench.closed_loop(texts)
        results["renq_e2e"] = latency_stats(jobs, span)
        results["renq_e2e"]["rest_submissions_s"] = len(texts) / submitted_s
        results["renq_e2e"]["refused_and_retried"] = dict(bench.refused)
        print(results["renq_e2e"], flush=True)

        print("== latency vs throughput by (batch_size, batch_timeout)", flush=True)
        results["settings"] = []
        per_setting = 100 if quick else 200
        for batch_size, timeout in ((1, 0.0), (8, 0.005), (32, 0.01), (64, 0.02)):
            bench.configure(batch_size=batch_size, batch_timeout=timeout)
            jobs, span = bench.open_loop(short_texts(per_setting, seed=batch_size), rate=150)
            row = {
                "batch_size": batch_size,
                "batch_timeout": timeout,
                "offered_jobs_s": 150,
                **latency_stats(jobs, span),
            }
            results["settings"].append(row)
            print(row, flush=True)
        bench.configure(batch_size=32, batch_timeout=0.01)
    results["web_log_e2e"] = common.keep_web_log("e2e")


def scenario_pools(results: dict, quick: bool) -> None:
    """Idle realtime latency with each worker pool, in one run: the GPU worker's pool is chosen
    by this measurement (`make worker` and docker/ use the winner)."""
    service, tenant, key = setup_rows()
    purge_queues(service_queues(IDLE_SERVICE))
    results["idle_pools"] = {}
    with ProcessGroup() as procs:
        url = procs.web(free_port(), workers=1)
        bench = Bench(procs, url, key, service, tenant)
        for pool in POOLS:
            name = f"bench-pool-{pool}"
            print(f"== idle realtime latency, --pool {pool}", flush=True)
            procs.worker(
                name, service_queues(IDLE_SERVICE), threads=MODEL_THREADS, extra=["--pool", pool]
            )
            results["idle_pools"][pool] = bench.idle_latency(30 if quick else 100)
            print(results["idle_pools"][pool], flush=True)
            procs.stop_one(name)


def scenario_bulk_priority(results: dict, engine, which: set[str], quick: bool) -> None:
    """One web process, one worker on the bulk and priority services (model on MODEL_THREADS),
    the control worker (beat: aging, expiry, sweep) as `make demo` runs them."""
    embedding_service(bulk.SERVICE)
    priority.priority_service()
    _, key = bench_tenant()
    queues = service_queues(bulk.SERVICE) + service_queues(priority.SERVICE)
    purge_queues(queues + [control_queue()])
    with ProcessGroup() as procs:
        url = procs.web(free_port(), workers=1)
        procs.worker(
            "bench-control",
            [control_queue()],
            beat=True,
            extra=["-s", str(common.ROOT / ".run" / "bench-beat"), *CONTROL_WORKER_OPTIONS],
        )
        procs.worker("bench-gpu", queues, threads=MODEL_THREADS)
        if "bulk" in which:
            print("== bulk: one bulk job of short texts vs the raw model", flush=True)
            results["bulk"] = bulk.run(url, key, engine, quick=quick)
            print(results["bulk"], flush=True)
        if "priority" in which:
            results["priority"] = priority.run(url, key, quick=quick)
    results["web_log_bulk_priority"] = common.keep_web_log("bulk-priority")


def _git(*args: str) -> str:
    import subprocess

    try:
        return subprocess.run(
            ["git", *args], cwd=common.ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=600, help="jobs of the e2e/drain runs")
    parser.add_argument("--quick", action="store_true", help="smaller runs, for development")
    parser.add_argument(
        "--only", default=",".join(SCENARIOS), help=f"comma-separated subset of {SCENARIOS}"
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=common.RESULTS,
        help="where README.md, results.json and the plots go (default bench/results)",
    )
    parser.add_argument(
        "--unpinned",
        action="store_true",
        help="leave the model's cores shared with the rest of the stack (no RENQ_MODEL_CPUS), "
        "to compare with the default pinned run",
    )
    parser.add_argument(
        "--noop-pool",
        default="prefork",
        choices=("prefork", "solo", "threads"),
        help="the no-op scenario's worker pool (default prefork, as the README runs workers)",
    )
    args = parser.parse_args()
    which = {s.strip() for s in args.only.split(",") if s.strip()}
    unknown = which - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(sorted(unknown))}")
    n_jobs = 300 if args.quick else args.jobs
    out_dir: Path = args.results_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    common.ensure_database()
    common.clear_jobs()
    torch.set_num_threads(MODEL_THREADS)
    results: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": "cuda" if torch.cuda.is_available() else "cpu",
            "model_threads": MODEL_THREADS,
            "model_cpus": [] if args.unpinned else sorted(common.MODEL_CPUS),
            "stack_cpus": sorted(common.STACK_CPUS),
            "date": timezone.now().isoformat(),
            "load_average_at_start": os.getloadavg(),
            "sweep_interval_s": settings.RENQ_SWEEP_INTERVAL_S,
            "commit": _git("rev-parse", "--short", "HEAD"),
            "uncommitted_changes": bool(_git("status", "--porcelain", "--untracked-files=no")),
        },
        "quick": args.quick,
        "scenarios": sorted(which, key=SCENARIOS.index),
    }
    engine = None
    if which & {"inprocess", "bulk", "result_bytes"}:
        engine = load_engine("embedding", MODEL_REF, device="cpu")
        engine.run_batch([{"texts": ["warm up"]}])
    pinning = (
        contextlib.nullcontext({"model_cpus": [], "server_threads_pinned": 0})
        if args.unpinned
        else common.model_on_its_own_cores()
    )
    with pinning as pinned:
        results["machine"]["pinning"] = pinned
        if "inprocess" in which:
            scenario_inprocess(results, engine, args.quick)
        if "e2e" in which:
            scenario_e2e(results, n_jobs, args.quick)
        if "pools" in which:
            scenario_pools(results, args.quick)
    if "noop" in which:
        results["noop"] = noop_throughput.run(quick=args.quick, pool=args.noop_pool)
    if "tracing" in which:
        results["tracing"] = tracing_cost.run(quick=args.quick)
    if "profile" in which:
        print("== submit path profile (pyinstrument, in-process)", flush=True)
        results["submit_profile"] = submit_profile.run(
            posts=100 if args.quick else 300, out=out_dir / "submit_profile.txt"
        )
        print(results["submit_profile"], flush=True)
    if which & {"bulk", "priority"}:
        scenario_bulk_priority(results, engine, which, args.quick)
    if "tenants" in which:
        results["tenants"] = tenants.run(quick=args.quick)
    if "fast_path" in which:
        results["fast_path"] = fast_path.run(quick=args.quick)
    if "result_bytes" in which:
        results["result_bytes"] = result_bytes.run(engine)
        print(result_bytes.report(results["result_bytes"]), flush=True)
    if "llm" in which:
        results["llm"] = llm_serving.run(quick=args.quick, out_dir=out_dir)
    results["machine"]["load_average_at_end"] = os.getloadavg()
    results["machine"]["bench_seconds"] = round(time.time() - started, 1)
    (out_dir / "results.json").write_text(json.dumps(results, indent=2, default=str))
    plot(results, out_dir)
    write_report(results, out_dir)
    print((out_dir / "README.md").read_text())
    print(f"bench took {results['machine']['bench_seconds']:.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
