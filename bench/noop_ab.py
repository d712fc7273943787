"""CPU per no-op job of two checkouts, run after run, alternating.

The stack's CPU per job moves run to run on a shared machine by more than one change saves,
and drifts over minutes. This runs the no-op bench's single-job case (bench/noop_throughput.py:
8 client threads, one job per POST, one web process, one prefork worker) in each checkout in
turn, on that checkout's code, so each pair sees the same machine within a minute.

    git worktree add /tmp/base <commit>
    .venv/bin/python bench/noop_ab.py --base /tmp/base [--rounds 3] [--seconds 10]

The base checkout needs .run/secret_key (copy it) and runs on this checkout's .venv.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402  (the bench's environment, passed on to each case)

ROLES = ("web", "worker", "postgres", "rabbitmq", "redis")

# Run in a checkout (its working directory): that checkout's bench and processes.
ONE_CASE = """
import json, sys, time
sys.path[:0] = ["bench", "."]
from bench import common
import django
django.setup()
common.ensure_database()
common.clear_jobs()
from bench import noop_throughput as noop
from bench.common import JsonPoster, bench_tenant, purge_queues
from inference.dispatch.queues import service_queues
from processes import ProcessGroup, free_port
noop.noop_service()
_, key = bench_tenant()
purge_queues(service_queues(noop.SERVICE))
with ProcessGroup() as procs:
    url = procs.web(free_port(), workers=1)
    procs.worker("bench-noop", service_queues(noop.SERVICE), extra=["--pool", "prefork"])
    poster = JsonPoster(url, key)
    for i in range(20):
        poster.post("/api/v1/jobs", {"service": noop.SERVICE, "input": {"texts": [f"warm {i}"]}})
    time.sleep(1.0)
    case = noop.run_case(
        procs, url, key, threads=8, per_post=1, duration_s=SECONDS, cap=10**9
    )
print("RESULT " + json.dumps(case))
"""


def one_case(checkout: Path, seconds: float) -> dict:
    code = ONE_CASE.replace("SECONDS", repr(seconds))
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=checkout, capture_output=True, text=True, timeout=600
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{checkout}: {done.stderr[-2000:]}")
    case = json.loads(lines[-1].removeprefix("RESULT "))
    return {
        "completed_jobs_s": round(case["completed_jobs_s"], 1),
        "cpu_ms_per_job": round(case["cpu_ms_per_job"], 3),
        **case["cpu_ms_per_job_by_role"],
    }


def run(base: Path, rounds: int, seconds: float) -> dict:
    this = Path(__file__).resolve().parent.parent
    runs: dict[str, list[dict]] = {"base": [], "this": []}
    for n in range(rounds):
        for name, checkout in (("base", base), ("this", this)):
            runs[name].append(one_case(checkout, seconds))
            print(f"round {n + 1} {name}: {runs[name][-1]}", flush=True)
    medians = {
        name: {
            key: round(statistics.median(r[key] for r in results), 3)
            for key in ("completed_jobs_s", "cpu_ms_per_job", *ROLES)
        }
        for name, results in runs.items()
    }
    return {"base": str(base), "rounds": rounds, "seconds": seconds, "runs": runs,
            "medians": medians}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="of submissions per run")
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args()
    common.print_and_keep(run(args.base.resolve(), args.rounds, args.seconds), args.out)


if __name__ == "__main__":
    main()
