"""`make demo`: start web + workers + Flower, run a mixed workload over REST, print what ran."""

from __future__ import annotations

import os
import statistics
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import ROOT, ProcessGroup, free_port  # noqa: E402

TIERS = ("realtime", "api", "batch", "offline")
TERMINAL = {"succeeded", "failed", "expired", "cancelled"}
TEXTS = [
    "renq schedules inference jobs by priority",
    "a cat sits on the mat",
    "GPUs like large batches; users like low latency",
    "the quarterly report is due on friday",
    "micro-batching closes a batch at batch_size or batch_timeout",
]


def queues(service: str) -> list[str]:
    prefix = os.environ.get("RENQ_QUEUE_PREFIX", "")
    return [f"{prefix}{service}.{tier}" for tier in TIERS]


def workload() -> list[dict]:
    jobs = []
    for i in range(48):
        tier = TIERS[i % 4]
        jobs.append(
            {
                "service": "embedding",
                "priority": tier,
                "input": {"texts": [TEXTS[i % 5], TEXTS[(i + 2) % 5]]},
            }
        )
    for i in range(8):
        jobs.append(
            {
                "service": "reranker",
                "priority": TIERS[i % 4],
                "input": {"query": "how does renq batch jobs?", "documents": TEXTS, "top_n": 3},
            }
        )
    for i in range(6):
        jobs.append(
            {
                "service": "llm",
                "priority": TIERS[i % 4],
                "input": {
                    "prompt": f"request {i}: the scheduler",
                    "max_tokens": 8,
                    "temperature": 0,
                },
            }
        )
    return jobs


def main() -> int:
    key = (ROOT / "fixtures" / "DEMO_API_KEY").read_text().strip()
    headers = {"Authorization": f"Bearer {key}"}
    with ProcessGroup() as procs:
        print("starting web, workers and Flower (logs in .run/) ...", flush=True)
        url = procs.web(free_port())
        procs.worker("embedding-gpu", queues("embedding"))
        control = os.environ.get("RENQ_QUEUE_PREFIX", "") + "renq.control"
        procs.worker("small-models", queues("reranker") + queues("llm") + [control], beat=True)
        flower = procs.flower(free_port())
        print(f"web {url}   flower {flower}   admin {url}/admin/   docs {url}/api/docs/")

        session = requests.Session()
        session.headers.update(headers)
        submitted = []
        started = time.time()

        def submit(body):
            response = session.post(f"{url}/api/v1/jobs", json=body, timeout=10)
            return body, response

        with ThreadPoolExecutor(max_workers=4) as pool:
            for body, response in pool.map(submit, workload()):
                if response.status_code != 202:
                    print(
                        f"refused {body['service']}/{body['priority']}: "
                        f"{response.status_code} {response.text[:200]}"
                    )
                    continue
                submitted.append(response.json()["id"])
        print(f"submitted {len(submitted)} jobs in {time.time() - started:.2f}s; waiting ...")

        results = {}
        deadline = time.time() + 120
        while len(results) < len(submitted) and time.time() < deadline:
            for job_id in submitted:
                if job_id in results:
                    continue
                job = session.get(f"{url}/api/v1/jobs/{job_id}", timeout=10).json()
                if job["status"] in TERMINAL:
                    results[job_id] = job
            time.sleep(0.2)
        print_report(list(results.values()), len(submitted))
        print_samples(list(results.values()))
        workers = requests.get(f"{flower}/api/workers", timeout=5).json()
        print(f"\nFlower sees {len(workers)} workers: {', '.join(sorted(workers))}")
        print("stopping processes ...")
    missing = len(submitted) - len(results)
    if missing:
        print(f"{missing} jobs did not finish in time")
        return 1
    return 0


def print_report(jobs: list[dict], submitted: int) -> None:
    groups = defaultdict(list)
    for job in jobs:
        groups[(job["service"], job["priority"])].append(job)
    print(
        f"\n{'service':<10} {'tier':<9} {'jobs':>4} {'ok':>4} {'expired':>7} {'failed':>6} "
        f"{'wait p50 ms':>11} {'infer p50 ms':>12} {'batch avg':>9}"
    )
    for service in ("embedding", "reranker", "llm"):
        for tier in TIERS:
            group = groups.get((service, tier), [])
            if not group:
                continue
            ok = [j for j in group if j["status"] == "succeeded"]
            waits = [j["queue_wait_ms"] for j in ok if j["queue_wait_ms"] is not None]
            infer = [j["inference_ms"] for j in ok if j["inference_ms"] is not None]
            batch = [j["batch_size"] for j in ok if j["batch_size"]]
            print(
                f"{service:<10} {tier:<9} {len(group):>4} {len(ok):>4} "
                f"{sum(j['status'] == 'expired' for j in group):>7} "
                f"{sum(j['status'] == 'failed' for j in group):>6} "
                f"{med(waits):>11} {med(infer):>12} "
                f"{(sum(batch) / len(batch)) if batch else 0:>9.1f}"
            )
    print(f"{len(jobs)}/{submitted} jobs reached a final state")


def med(values) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def print_samples(jobs: list[dict]) -> None:
    shown = set()
    for job in jobs:
        if job["status"] != "succeeded" or job["service"] in shown:
            continue
        shown.add(job["service"])
        result = job.get("result") or {}
        if job["service"] == "embedding":
            text = f"{len(result['embeddings'])} vectors × {result['dim']} dims, first values "
            text += str([round(x, 4) for x in result["embeddings"][0][:4]])
        elif job["service"] == "reranker":
            text = f"ranking {result['ranking']} scores {[round(s, 3) for s in result['scores']]}"
        else:
            text = f"{result['text']!r} usage {result['usage']}"
        print(f"sample {job['service']:<9}: {text}")


if __name__ == "__main__":
    raise SystemExit(main())
