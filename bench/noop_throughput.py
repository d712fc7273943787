"""The stack's own cost, without a model: no-op jobs through REST → Postgres → RabbitMQ → worker
→ result, (a) one job per POST from several client threads, (b) 100 jobs per POST; jobs
accepted and completed per second and CPU ms per job of web + worker + Postgres + RabbitMQ +
Redis (bench.cpu), from the same run.

Submissions run for a fixed time (or up to a cap of jobs), then the run lasts until the worker
has finished every accepted job: "completed per second" is jobs ÷ (last finish − first POST).
"""

from __future__ import annotations

import json
import threading
import time

from django.db.models import Max

from bench.common import (
    DB_NAME,
    JsonPoster,
    Ticker,
    bench_tenant,
    keep_web_log,
    purge_queues,
    wait_finished,
)
from bench.cpu import CpuMeter, pg_connections, pg_sessions

SERVICE = "bench-noop"
NOOP_RUNTIME = dict(
    kind="noop",
    model_ref="none",
    batch_size=256,
    batch_timeout=0.005,
    max_total_tokens=1_000_000,
    max_queue_size=1_000_000,
    queue_timeout=3600,
    inference_timeout=60,
    total_timeout=3600,
    rate_limit=0,
    enable_cache=False,
    max_items_per_job=16,
    preemption_budget_s=None,
)


def noop_service():
    from inference.models import Service

    service, _ = Service.objects.update_or_create(name=SERVICE, defaults=NOOP_RUNTIME)
    return service


def _submitters(url: str, key: str, *, threads: int, per_post: int, duration_s: float, cap: int):
    """Threads POSTing until `duration_s` passed or `cap` jobs were accepted. Returns
    (accepted, refused, seconds until the last answer, request latencies in ms)."""
    lock = threading.Lock()
    state = {"accepted": 0, "refused": 0, "last": 0.0}
    latencies: list[float] = []
    t0 = time.time()
    deadline = t0 + duration_s

    def one_job(i: int) -> dict:
        return {"service": SERVICE, "priority": "api", "input": {"texts": [f"noop {i}"]}}

    poster = JsonPoster(url, key)

    def client(k: int) -> None:
        i = 0
        while time.time() < deadline:
            with lock:
                if state["accepted"] >= cap:
                    return
            body = (
                one_job(k * 10**7 + i)
                if per_post == 1
                else [one_job(k * 10**7 + i + j) for j in range(per_post)]
            )
            i += per_post
            started = time.perf_counter()
            status, _, answer = poster.post("/api/v1/jobs", body)
            elapsed_ms = (time.perf_counter() - started) * 1000
            with lock:
                latencies.append(elapsed_ms)
                state["last"] = time.time()
                if status == 202:
                    accepted = 1 if per_post == 1 else json.loads(answer)["accepted"]
                    state["accepted"] += accepted
                else:
                    state["refused"] += per_post

    workers = [threading.Thread(target=client, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return state["accepted"], state["refused"], state["last"] - t0, latencies


def run_case(
    procs, url: str, key: str, *, threads: int, per_post: int, duration_s: float, cap: int
) -> dict:
    from inference.models import Job

    service = noop_service()
    jobs = Job.objects.filter(service=service)
    before = jobs.count()
    meter = CpuMeter(
        DB_NAME,
        {"web": procs.procs["web"].pid, "worker": procs.procs["bench-noop"].pid},
    )
    sessions0 = pg_sessions(DB_NAME)
    connections: list[int] = []
    sampler = Ticker(0.2, lambda: connections.append(pg_connections(DB_NAME)))
    sampler.start()
    meter.start()
    t0 = time.time()
    accepted, refused, submit_s, latencies = _submitters(
        url, key, threads=threads, per_post=per_post, duration_s=duration_s, cap=cap
    )
    done = wait_finished(jobs, before + accepted, timeout_s=300) - before
    cpu = meter.stop()
    sampler.stop()
    sessions = pg_sessions(DB_NAME) - sessions0
    last_finish = jobs.aggregate(t=Max("finished_at"))["t"].timestamp()
    run_jobs = jobs.order_by("-created_at")[: max(1, done)]
    job_ms = sorted(
        (finished - created).total_seconds() * 1000
        for created, finished in run_jobs.values_list("created_at", "finished_at")
        if finished is not None
    )
    # Weighted by job: the pass size the average job shared (a pool that serves in clumps
    # shows here and in the latency, not in CPU per job).
    passes = [size for (size,) in run_jobs.values_list("batch_size") if size]
    succeeded = jobs.filter(status="succeeded").count() - before
    span_s = last_finish - t0
    latencies.sort()
    return {
        "client_threads": threads,
        "jobs_per_post": per_post,
        "accepted": accepted,
        "refused": refused,
        "finished": done,
        "succeeded": succeeded,
        "accepted_jobs_s": accepted / submit_s,
        "completed_jobs_s": succeeded / span_s,
        "job_ms_p50": job_ms[len(job_ms) // 2] if job_ms else None,
        "job_ms_p99": job_ms[min(len(job_ms) - 1, int(0.99 * len(job_ms)))] if job_ms else None,
        "jobs_per_pass": sum(passes) / len(passes) if passes else None,
        "post_ms_p50": latencies[len(latencies) // 2],
        "post_ms_p99": latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "seconds": round(span_s, 2),
        "cpu": cpu,
        "cpu_ms_per_job": 1000 * cpu["stack_s"] / max(1, succeeded),
        "cpu_ms_per_job_by_role": {
            role: round(1000 * cpu[f"{role}_s"] / max(1, succeeded), 3)
            for role in ("web", "worker", "postgres", "rabbitmq", "redis")
        },
        "pg_sessions_opened": sessions,
        "pg_sessions_per_post": sessions / max(1, len(latencies)),
        "pg_connections_peak": max(connections, default=0),
    }


def run(*, quick: bool, web_workers: int = 2, pool: str = "prefork") -> dict:
    from processes import ProcessGroup, free_port

    from inference.dispatch.queues import service_queues

    noop_service()
    _, key = bench_tenant()
    purge_queues(service_queues(SERVICE))
    duration = 3.0 if quick else 10.0
    results: dict = {"web_workers": web_workers, "pool": pool}
    with ProcessGroup() as procs:
        url = procs.web(free_port(), workers=web_workers)
        procs.worker("bench-noop", service_queues(SERVICE), extra=["--pool", pool])
        # Warm-up: each web process's first requests pay for imports and connections.
        poster = JsonPoster(url, key)
        for i in range(20):
            status, _, answer = poster.post(
                "/api/v1/jobs", {"service": SERVICE, "input": {"texts": [f"warm {i}"]}}
            )
            if status != 202:
                raise RuntimeError(f"warm-up POST answered {status}: {answer[:500]!r}")
        time.sleep(1.0)
        print("== no-op: one job per POST", flush=True)
        results["single"] = run_case(
            procs,
            url,
            key,
            threads=8,
            per_post=1,
            duration_s=duration,
            cap=2_000 if quick else 20_000,
        )
        print(results["single"], flush=True)
        print("== no-op: 100 jobs per POST", flush=True)
        results["batched"] = run_case(
            procs,
            url,
            key,
            threads=4,
            per_post=100,
            duration_s=duration,
            cap=5_000 if quick else 30_000,
        )
        print(results["batched"], flush=True)
    results["web_log"] = keep_web_log("noop")
    return results
