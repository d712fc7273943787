"""Answered jobs under kill -9: does every job whose client got its answer end with it?

A realtime success is answered before its store. Four keep-alive clients send single-text
`POST /v1/embeddings` at `X-Renq-Priority: realtime` while the embedding worker's pool process
is killed with SIGKILL a few times (Celery's parent starts a new one), with a control worker
taking over lapsed leases as the README runs it. Once every job is final it counts, of the
jobs whose client got a 200, how many rows ended other than `succeeded`: a worker killed
between an answer and its store used to leave such a job to run again past its
queue_timeout and end `expired`, its client holding a result.

    .venv/bin/python bench/kill_answered.py [--kills 3] [--clients 4] [--out FILE]

Run it on two checkouts (git worktree add /tmp/base <commit>; cd there; run this checkout's
.venv): the window is a few milliseconds per request, so a run catches a few such jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402  (sets the bench's environment first)

SERVICE = "kill-answered"
FINAL = ("succeeded", "failed", "expired", "cancelled")


def run(*, kills: int, clients: int, between_s: float = 8.0) -> dict:
    import django

    django.setup()
    from processes import CONTROL_WORKER_OPTIONS, ProcessGroup, free_port

    from bench.idle_budget import _pool_process
    from inference.dispatch.queues import control_queue, service_queues
    from inference.models import Job

    service, key, nonce = common.fresh_embedding_service(SERVICE)
    answered: list[str] = []
    refused = Counter()
    lock, stop = threading.Lock(), threading.Event()
    with ProcessGroup() as group:
        url = group.web(free_port(), workers=2)
        group.worker(SERVICE, service_queues(SERVICE), threads=common.MODEL_THREADS)
        control = ["-s", str(common.ROOT / ".run" / "kill-answered-beat"), *CONTROL_WORKER_OPTIONS]
        group.worker("control", [control_queue()], beat=True, extra=control)

        def client(k: int) -> None:
            poster = common.JsonPoster(url, key)
            i = 0
            while not stop.is_set():
                i += 1
                body = {"model": SERVICE, "input": f"kill {nonce} {k} {i}"}
                try:
                    status, headers, _ = poster.post(
                        "/v1/embeddings", body, {"X-Renq-Priority": "realtime"}
                    )
                except OSError:
                    status, headers = 0, {}
                with lock:
                    if status == 200:
                        answered.append({k.lower(): v for k, v in headers.items()}["x-renq-job-id"])
                    else:
                        refused[status] += 1

        threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
        for thread in threads:
            thread.start()
        worker = group.procs[SERVICE].pid
        for _ in range(kills):
            time.sleep(between_s / 2)
            os.kill(_pool_process(worker), signal.SIGKILL)
            time.sleep(between_s)
        stop.set()
        for thread in threads:
            thread.join()
        jobs = Job.objects.filter(service=service)
        deadline = time.time() + 120
        while time.time() < deadline and jobs.exclude(status__in=FINAL).exists():
            time.sleep(1)
        statuses = Counter(jobs.values_list("status", flat=True))
        of_answered = Counter(Job.objects.filter(pk__in=answered).values_list("status", flat=True))
    return {
        "kills": kills,
        "clients": clients,
        "answered": len(answered),
        "not_answered": dict(refused),
        "jobs_by_status": dict(statuses),
        "answered_jobs_by_status": dict(of_answered),
        "answered_but_not_succeeded": len(answered) - of_answered.get("succeeded", 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = run(kills=args.kills, clients=args.clients)
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
