"""What one idle realtime request costs the machine, beside its forward pass.

Sequential single-text `POST /v1/embeddings` (or `POST /api/v1/jobs?wait=`) at
`X-Renq-Priority: realtime`, one keep-alive client, the model sharing the cores as the README
runs it. Per request it reports: CPU ms of each process role (web, worker, PostgreSQL,
RabbitMQ, Redis; bench.cpu), the worker pool process's CPU and runqueue wait by thread (the
model thread, the main thread, the rest; /proc/<tid>/schedstat), Redis commands (INFO
commandstats; a script's own calls count), and PostgreSQL commits and rows written
(pg_stat_database). On a shared machine the model thread's runqueue wait is the part of the
overhead that other work's CPU causes: the idle trace (bench/fast_path.py) gives the stages'
latency, this gives what each stage burns meanwhile.

    .venv/bin/python bench/idle_budget.py [--requests 300] [--path v1 rest] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402  (sets the bench's environment first)

SERVICE = "idle-budget"
WARM_UP = 20
THREAD_FIGURES = ("cpu_ms", "runqueue_wait_ms", "switches_chosen", "switches_preempted")
SCALES = (1e6, 1e6, 1, 1)  # ns → ms; switches are counts


def _threads(pid: int) -> dict[int, tuple[int, ...]]:
    """tid → (ns on a CPU, ns waiting on a runqueue, switches away that it chose (a lock
    such as the GIL, I/O), switches it was made to take (preempted)) of each thread."""
    times = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        on_cpu, waiting, _ = map(int, (task / "schedstat").read_text().split())
        status = dict(
            line.split(":\t", 1) for line in (task / "status").read_text().splitlines()
        )
        chosen, preempted = status["voluntary_ctxt_switches"], status["nonvoluntary_ctxt_switches"]
        times[int(task.name)] = (on_cpu, waiting, int(chosen), int(preempted))
    return times


def _pool_process(worker_pid: int) -> int:
    children = Path(f"/proc/{worker_pid}/task/{worker_pid}/children").read_text().split()
    return int(children[0])


def _redis_calls(client) -> dict[str, int]:
    return {name[len("cmdstat_") :]: v["calls"] for name, v in client.info("commandstats").items()}


def _pg_counts() -> tuple[int, ...]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT xact_commit, tup_inserted, tup_updated FROM pg_stat_database"
            " WHERE datname = %s",
            [common.DB_NAME],
        )
        return tuple(cursor.fetchone())


def _send(poster: common.JsonPoster, path: str, text: str) -> None:
    if path == "v1":
        status, _, answer = poster.post(
            "/v1/embeddings", {"model": SERVICE, "input": text}, {"X-Renq-Priority": "realtime"}
        )
    else:
        status, _, answer = poster.post(
            "/api/v1/jobs?wait=10",
            {"service": SERVICE, "priority": "realtime", "input": {"texts": [text]}},
        )
    if status != 200:
        raise RuntimeError(f"{path}: {status} {answer[:300]!r}")


def run(requests: int, path: str) -> dict:
    import django

    django.setup()
    import redis
    from processes import ProcessGroup, free_port

    from bench.cpu import CpuMeter
    from bench.fast_path import raw_forward_ms
    from inference.dispatch.queues import service_queues

    _, key, nonce = common.fresh_embedding_service(SERVICE)
    texts = [f"hello world {nonce} {i}" for i in range(requests + WARM_UP)]
    raw_ms = statistics.median(raw_forward_ms(texts[:110])[10:])
    redis_client = redis.Redis.from_url(common.BENCH_ENV["RENQ_REDIS_URL"])
    latencies: list[float] = []
    with ProcessGroup() as group:
        url = group.web(free_port(), workers=1)
        group.worker(SERVICE, service_queues(SERVICE), threads=common.MODEL_THREADS)
        worker_pid = group.procs[SERVICE].pid
        poster = common.JsonPoster(url, key)
        for text in texts[:WARM_UP]:
            _send(poster, path, text)
        pool_pid = _pool_process(worker_pid)
        meter = CpuMeter(common.DB_NAME, {"web": group.procs["web"].pid, "worker": worker_pid})
        threads0, redis0, pg0 = _threads(pool_pid), _redis_calls(redis_client), _pg_counts()
        meter.start()
        for text in texts[WARM_UP:]:
            started = time.perf_counter()
            _send(poster, path, text)
            latencies.append((time.perf_counter() - started) * 1000)
        cpu = meter.stop()
        threads1, redis1, pg1 = _threads(pool_pid), _redis_calls(redis_client), _pg_counts()

    def per_request(value: float) -> float:
        return round(value / requests, 2)

    spent = {
        tid: [
            (b - a) / scale
            for a, b, scale in zip(threads0.get(tid, (0,) * 4), times, SCALES, strict=True)
        ]
        for tid, times in threads1.items()
    }
    model_tid = max(spent, key=lambda tid: spent[tid][0] if tid != pool_pid else -1)
    others = [times for tid, times in spent.items() if tid not in (model_tid, pool_pid)]
    by_thread = {
        "model": spent[model_tid],
        "main (the task: claim, batching, announce)": spent[pool_pid],
        "the other threads (store, head starts, leases)": [
            sum(t[i] for t in others) for i in range(len(THREAD_FIGURES))
        ],
    }
    redis_calls = {name: calls - redis0.get(name, 0) for name, calls in redis1.items()}
    client_p50 = statistics.median(latencies)
    return {
        "path": path,
        "requests": requests,
        "raw_forward_p50_ms": round(raw_ms, 2),
        "client_p50_ms": round(client_p50, 2),
        "overhead_p50_ms": round(client_p50 - raw_ms, 2),
        "cpu_ms_per_request": {
            role: per_request(1000 * cpu[f"{role}_s"])
            for role in ("web", "worker", "postgres", "rabbitmq", "redis")
        },
        "pool_process_threads_ms_per_request": {
            name: dict(zip(THREAD_FIGURES, map(per_request, figures), strict=True))
            for name, figures in by_thread.items()
        },
        "redis_commands_per_request": {
            name: per_request(calls)
            for name, calls in sorted(redis_calls.items(), key=lambda kv: -kv[1])
            if calls >= requests / 2
        },
        "postgres_per_request": dict(
            zip(
                ("commits", "rows_inserted", "rows_updated"),
                (per_request(b - a) for a, b in zip(pg0, pg1, strict=True)),
                strict=True,
            )
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--path", choices=("v1", "rest"), nargs="+", default=["v1", "rest"])
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=common.ROOT
    ).stdout.strip()
    results = {"commit": commit, "cpus": os.cpu_count(), "model_threads": common.MODEL_THREADS}
    for path in args.path:
        results[path] = run(args.requests, path)
    common.print_and_keep(results, args.out)


if __name__ == "__main__":
    main()
