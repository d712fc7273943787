"""A client waiting for a list of jobs: renq_client's bulk() then results(), and what the stack
spends on the reads.

`--jobs` single-text jobs at batch priority, submitted 100 per POST by `RenqClient.bulk`, then
read back by `RenqClient.results` as they finish (its defaults: rounds 0.5 s apart); one web
process and one embedding worker as the README runs them, the model sharing the cores. Reports
texts/s from the first POST to the last result against the raw model batched in this process
before the stack starts, the client's requests, and the stack's CPU per job by process
(bench.cpu).

    .venv/bin/python bench/results_read.py [--jobs 3000] [--out FILE]

Compare two checkouts one after the other (git worktree add /tmp/base <commit>; copy this file
there and run it from there on this checkout's .venv): each runs its own client and server.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402  (sets the bench's environment first)

SERVICE = "results-read"
ROLES = ("web", "worker", "postgres", "rabbitmq", "redis")


def run(jobs: int) -> dict:
    import django

    django.setup()
    from processes import ProcessGroup, free_port

    from bench.cpu import CpuMeter
    from bench.fast_path import raw_batched_texts_s
    from inference.dispatch.queues import service_queues
    from renq_client import RenqClient

    _, key, nonce = common.fresh_embedding_service(SERVICE)
    raw = raw_batched_texts_s([f"raw {nonce} {i}" for i in range(640)])
    inputs = [{"texts": [f"read {nonce} {i}"]} for i in range(jobs)]
    with ProcessGroup() as group:
        url = group.web(free_port(), workers=1)
        group.worker(SERVICE, service_queues(SERVICE), threads=common.MODEL_THREADS)
        warm = RenqClient(url, key)
        warm_ids = warm.bulk(SERVICE, [{"texts": [f"warm {nonce} {i}"]} for i in range(64)])
        list(warm.results(warm_ids))
        client = RenqClient(url, key)
        meter = CpuMeter(
            common.DB_NAME, {"web": group.procs["web"].pid, "worker": group.procs[SERVICE].pid}
        )
        meter.start()
        started = time.perf_counter()
        ids = client.bulk(SERVICE, inputs, priority="batch")
        submitted_s = time.perf_counter() - started
        statuses: dict[str, int] = {}
        for job in client.results(ids):
            statuses[job["status"]] = statuses.get(job["status"], 0) + 1
        span_s = time.perf_counter() - started
        read_at = time.time()
        cpu = meter.stop()
    from django.db.models import Max, Min

    from inference.models import Job

    run = Job.objects.filter(pk__in=ids)
    done = run.aggregate(first=Min("started_at"), last=Max("finished_at"))
    return {
        "jobs": jobs,
        "statuses": statuses,
        "submitted_s": round(submitted_s, 2),
        "seconds": round(span_s, 2),
        "texts_s": round(jobs / span_s, 1),
        "raw_batched_texts_s": round(raw, 1),
        "vs_raw_batched": round(jobs / span_s / raw, 3),
        "client_requests": client.stats.requests,
        # From the first job's start to the last one's end, and how long after that the
        # client had read it.
        "worker_s": round((done["last"] - done["first"]).total_seconds(), 2),
        "last_read_after_last_finish_s": round(read_at - done["last"].timestamp(), 3),
        "cpu_ms_per_job": {role: round(1000 * cpu[f"{role}_s"] / jobs, 3) for role in ROLES},
        "stack_cpu_ms_per_job": round(1000 * cpu["stack_s"] / jobs, 3),
        "client_cpu_ms_per_job": round(1000 * cpu["client_s"] / jobs, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run(args.jobs)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
