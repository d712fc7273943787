"""`make demo`: start web + workers + Flower + the fake cloud APIs, run a mixed workload over
REST, kill the embedding GPU worker halfway, and print what ran where, the cascade and the cost.
"""

from __future__ import annotations

import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

sys.path.insert(0, str(Path(__file__).resolve().parent))
from processes import CONTROL_WORKER_OPTIONS, ROOT, ProcessGroup, free_port  # noqa: E402

sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "renq_site.settings")

TIERS = ("realtime", "api", "batch", "offline")
TERMINAL = {"succeeded", "failed", "expired", "cancelled"}
TEXTS = [
    "renq schedules inference jobs by priority",
    "a cat sits on the mat",
    "GPUs like large batches; users like low latency",
    "the quarterly report is due on friday",
    "micro-batching closes a batch at batch_size or batch_timeout",
]


# Each run's texts are new, so the result cache (enable_cache) does not answer them all.
RUN = uuid.uuid4().hex[:6]


def embedding_jobs(count: int, tiers: tuple[str, ...], texts_per_job: int, tag: str) -> list:
    return [
        {
            "service": "embedding",
            "priority": tiers[i % len(tiers)],
            "input": {
                "texts": [
                    f"{TEXTS[(i + k) % 5]} ({tag} run {RUN} job {i} text {k})"
                    for k in range(texts_per_job)
                ]
            },
        }
        for i in range(count)
    ]


def first_half() -> list[dict]:
    """Interactive traffic plus a batch/offline backlog that keeps the GPU worker busy."""
    jobs = embedding_jobs(16, ("realtime", "api"), 2, "first")
    jobs += embedding_jobs(160, ("batch", "offline"), 8, "backlog")
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
                    "prompt": f"request {i} of run {RUN}: the scheduler",
                    "max_tokens": 8,
                    "temperature": 0,
                },
            }
        )
    return jobs


def second_half() -> list[dict]:
    """After the embedding GPU worker died."""
    return embedding_jobs(16, ("realtime", "api"), 2, "second") + embedding_jobs(
        24, ("batch", "offline"), 4, "second"
    )


def main() -> int:
    import django

    django.setup()
    # fixtures/config.yaml is the CPU profile: its deadlines hold on this machine as shipped.
    return run_demo()


def run_demo() -> int:
    from inference.dispatch.queues import io_queues, service_queues
    from inference.models import Service
    from renq_site.celery import app

    key = (ROOT / "fixtures" / "DEMO_API_KEY").read_text().strip()
    upstream_port = free_port()
    env = {
        "RENQ_FAKE_UPSTREAM_URL": f"http://127.0.0.1:{upstream_port}",
        "RENQ_FREE_CLOUD_API_KEY": os.environ.get("RENQ_FREE_CLOUD_API_KEY", "sk-demo-free"),
        "RENQ_PAID_CLOUD_API_KEY": os.environ.get("RENQ_PAID_CLOUD_API_KEY", "sk-demo-paid"),
        # The sweep hands jobs stranded on a dead worker on; every 2 s so the demo is short.
        "RENQ_SWEEP_INTERVAL_S": "2",
    }
    os.environ.update(env)
    # Metrics of this run only: every process writes under PROMETHEUS_MULTIPROC_DIR.
    metrics_dir = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    shutil.rmtree(metrics_dir, ignore_errors=True)
    metrics_dir.mkdir(parents=True)
    with ProcessGroup(env) as procs:
        print("starting web, workers, Flower and the fake cloud APIs (logs in .run/) ...")
        procs.upstream(upstream_port)
        # Point the cloud backends of fixtures/config.yaml at this run's fake upstream.
        subprocess.run(
            [
                sys.executable,
                "manage.py",
                "renq_config",
                "load",
                "fixtures/config.yaml",
                "--only",
                "backends,routes",
            ],
            cwd=ROOT,
            check=True,
            stdout=subprocess.DEVNULL,
        )
        url = procs.web(free_port())
        # worker_count GPU worker processes per service (config.yaml), one model copy each;
        # capped by RENQ_DEMO_MAX_WORKERS (default: the CPU count) on a small machine.
        cap = int(os.environ.get("RENQ_DEMO_MAX_WORKERS") or os.cpu_count() or 1)
        for service in Service.objects.filter(active=True).order_by("name"):
            count = min(service.worker_count, cap)
            print(f"  {service.name}: {count} worker(s) (worker_count {service.worker_count})")
            for i in range(count):
                procs.worker(f"{service.name}-gpu{i}", service_queues(service.name), threads=1)
        procs.worker(
            "control", [app.conf.task_default_queue], beat=True, extra=CONTROL_WORKER_OPTIONS
        )
        procs.worker("io", io_queues(), concurrency=32, extra=["--pool", "threads"])
        # Flower's pages and API show every task's arguments: never without a login.
        flower_auth = os.environ.get("FLOWER_BASIC_AUTH") or f"renq:{secrets.token_urlsafe(12)}"
        flower = procs.flower(free_port(), flower_auth)
        print(f"web {url}   flower {flower}   admin {url}/admin/   docs {url}/api/docs/")
        print(f"metrics {url}/metrics")
        print(f"flower login (FLOWER_BASIC_AUTH): {flower_auth}")

        session = requests.Session()
        session.headers.update({"Authorization": f"Bearer {key}"})
        started = time.time()
        submitted = submit_all(session, url, first_half())
        print(f"submitted {len(submitted)} jobs in {time.time() - started:.2f}s")
        time.sleep(2.0)
        embedding_workers = [name for name in procs.procs if name.startswith("embedding-gpu")]
        for name in embedding_workers:
            procs.kill(name)
        print(
            f"killed the {len(embedding_workers)} embedding GPU worker(s) (SIGKILL): "
            "local-embedding is down"
        )
        second = submit_all(session, url, second_half())
        submitted += second
        print(f"submitted {len(second)} more jobs; waiting for every job to finish ...")

        results = wait_all(session, url, submitted, timeout_s=180)
        print(f"all done {time.time() - started:.1f}s after the first submission")
        print_report(list(results.values()), len(submitted))
        print_samples(list(results.values()))
        print_cascade(list(results.values()))
        print_costs(submitted)
        flower_login = tuple(flower_auth.split(":", 1))
        workers = requests.get(f"{flower}/api/workers", auth=flower_login, timeout=5).json()
        print(f"\nFlower sees {len(workers)} workers: {', '.join(sorted(workers))}")
        print("stopping processes ...")
    missing = len(submitted) - len(results)
    if missing:
        print(f"{missing} jobs did not finish in time")
        return 1
    return 0


def submit_all(session: requests.Session, url: str, bodies: list[dict]) -> list[str]:
    def submit(body):
        return body, session.post(f"{url}/api/v1/jobs", json=body, timeout=10)

    ids = []
    refused: dict[tuple[int, str], list[str]] = defaultdict(list)
    with ThreadPoolExecutor(max_workers=4) as pool:
        for body, response in pool.map(submit, bodies):
            if response.status_code != 202:
                try:
                    reason = response.json()["error"]["message"]
                except (ValueError, KeyError, TypeError):
                    reason = response.text[:200]
                key = (response.status_code, reason)
                refused[key].append(f"{body['service']}/{body['priority']}")
                continue
            ids.append(response.json()["id"])
    # Admission at work (e.g. config.yaml's rate_limit): one line per reason, not per job.
    for (status, message), jobs in refused.items():
        print(f"refused {len(jobs)} ({', '.join(sorted(set(jobs)))}): {status} {message}")
    return ids


def wait_all(session, url: str, ids: list[str], timeout_s: float) -> dict[str, dict]:
    results: dict[str, dict] = {}
    deadline = time.time() + timeout_s
    while len(results) < len(ids) and time.time() < deadline:
        for job_id in ids:
            if job_id in results:
                continue
            job = session.get(f"{url}/api/v1/jobs/{job_id}", timeout=10).json()
            if job["status"] in TERMINAL:
                results[job_id] = job
        time.sleep(0.5)
    return results


def print_report(jobs: list[dict], submitted: int) -> None:
    groups = defaultdict(list)
    for job in jobs:
        groups[(job["service"], job["priority"])].append(job)
    print(
        f"\n{'service':<10} {'tier':<9} {'jobs':>4} {'ok':>4} {'expired':>7} {'failed':>6} "
        f"{'local':>5} {'cloud':>5} {'wait p50 ms':>11} {'infer p50 ms':>12} {'batch avg':>9}"
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
                f"{sum(is_local(j) for j in ok):>5} {sum(not is_local(j) for j in ok):>5} "
                f"{med(waits):>11} {med(infer):>12} "
                f"{(sum(batch) / len(batch)) if batch else 0:>9.1f}"
            )
    print(f"{len(jobs)}/{submitted} jobs reached a final state")


def is_local(job: dict) -> bool:
    return not job.get("backend") or job["backend"].startswith("local-")


def med(values) -> str:
    return f"{statistics.median(values):.1f}" if values else "-"


def print_samples(jobs: list[dict]) -> None:
    shown = set()
    for job in jobs:
        if job["status"] != "succeeded" or job["service"] in shown or not is_local(job):
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


def print_cascade(jobs: list[dict]) -> None:
    """Each job's path through the backends, from the attempts the API reports."""
    paths = Counter()
    example = {}
    for job in jobs:
        attempts = job.get("backend_attempts") or []
        path = " -> ".join(
            f"{a['backend']} {'ok' if a['outcome'] == 'succeeded' else 'FAILED'}" for a in attempts
        )
        path = path or f"(no attempt: {job['status']})"
        paths[(job["service"], path)] += 1
        failures = [a["error"] for a in attempts if a["outcome"] != "succeeded"]
        if len(attempts) > 1 and failures:
            # The first failure's reason (a job whose first attempt succeeded and whose worker
            # died before storing it printed an empty one).
            example.setdefault(path, (failures[0], job.get("route_reason") or ""))
    print(f"\n{'service':<10} {'jobs':>5}  path through the cascade (attempts table)")
    for (service, path), count in sorted(paths.items(), key=lambda kv: (kv[0][0], -kv[1])):
        print(f"{service:<10} {count:>5}  {path}")
    for path, (error, reason) in example.items():
        print(f"  e.g. {path}:\n     local error: {error}\n     route: {reason[:160]}")


def print_costs(job_ids: list[str]) -> None:
    """What this run's cloud calls cost, and what it would have cost all on the cloud."""
    from routing.costs import costs_by_backend, costs_by_tenant
    from routing.models import JobAttempt

    attempts = JobAttempt.objects.filter(job_id__in=job_ids)
    print(f"\n{'backend':<16} {'attempts':>8} {'ok':>5} {'in tokens':>10} {'cost USD':>11}")
    for row in costs_by_backend(attempts):
        print(
            f"{row.backend:<16} {row.attempts:>8} {row.succeeded:>5} {row.input_tokens:>10} "
            f"{row.cost:>11.6f}"
        )
    for row in costs_by_tenant(attempts):
        print(
            f"tenant {row.tenant}: {row.jobs} routed jobs cost ${row.cost:.6f}; all on the "
            f"cheapest paid cloud: ${row.all_cloud_cost:.6f}; saved ${row.saved:.6f} "
            f"({(row.saved / row.all_cloud_cost * 100) if row.all_cloud_cost else 0:.0f}%)"
        )


if __name__ == "__main__":
    raise SystemExit(main())
