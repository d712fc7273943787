"""A realtime job submitted without a wait and polled: what a client that cannot hold a request
open sees, and what the stack spends on it.

Sequential single-text `POST /api/v1/jobs` at `priority: realtime` (a 202), each followed by
`GET /api/v1/jobs/<id>` every `--poll-ms` until it reads `succeeded`; one web process and one
embedding worker as the README runs them, the model sharing the cores. Reports the client's
time from POST to the succeeded read (p50, p99) and the stack's CPU per job by process
(bench.cpu), the polling GETs included.

    .venv/bin/python bench/plain_post_poll.py [--requests 200] [--poll-ms 2] [--out FILE]

Compare two checkouts one after the other (git worktree add /tmp/base <commit>; run this file
from there on this checkout's .venv), alternating a few runs: one run moves by more than a
change does.
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

SERVICE = "plain-post-poll"
WARM_UP = 20
ROLES = ("web", "worker", "postgres", "rabbitmq", "redis")


def _submit_and_poll(poster: common.JsonPoster, text: str, poll_s: float) -> None:
    body = {"service": SERVICE, "priority": "realtime", "input": {"texts": [text]}}
    status, _, answer = poster.post("/api/v1/jobs", body)
    if status != 202:
        raise RuntimeError(f"POST: {status} {answer[:300]!r}")
    path = f"/api/v1/jobs/{json.loads(answer)['id']}"
    while True:
        status, _, answer = poster.get(path)
        job = json.loads(answer)
        if job["status"] == "succeeded":
            return
        if status != 200 or job["status"] in ("failed", "expired", "cancelled"):
            raise RuntimeError(f"GET: {status} {answer[:300]!r}")
        time.sleep(poll_s)


def run(requests: int, poll_ms: float) -> dict:
    import django

    django.setup()
    from processes import ProcessGroup, free_port

    from bench.cpu import CpuMeter
    from inference.dispatch.queues import service_queues

    _, key, nonce = common.fresh_embedding_service(SERVICE)
    texts = [f"plain {nonce} {i}" for i in range(requests + WARM_UP)]
    latencies: list[float] = []
    with ProcessGroup() as group:
        url = group.web(free_port(), workers=1)
        group.worker(SERVICE, service_queues(SERVICE), threads=common.MODEL_THREADS)
        poster = common.JsonPoster(url, key)
        for text in texts[:WARM_UP]:
            _submit_and_poll(poster, text, poll_ms / 1000)
        meter = CpuMeter(
            common.DB_NAME, {"web": group.procs["web"].pid, "worker": group.procs[SERVICE].pid}
        )
        meter.start()
        for text in texts[WARM_UP:]:
            started = time.perf_counter()
            _submit_and_poll(poster, text, poll_ms / 1000)
            latencies.append((time.perf_counter() - started) * 1000)
        cpu = meter.stop()
    latencies.sort()
    return {
        "requests": requests,
        "poll_ms": poll_ms,
        "client_ms": {
            "p50_ms": round(common.pct(latencies, 50), 2),
            "p99_ms": round(common.pct(latencies, 99), 2),
        },
        "cpu_ms_per_job": {role: round(1000 * cpu[f"{role}_s"] / requests, 2) for role in ROLES},
        "stack_cpu_ms_per_job": round(1000 * cpu["stack_s"] / requests, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--poll-ms", type=float, default=2.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run(args.requests, args.poll_ms)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
