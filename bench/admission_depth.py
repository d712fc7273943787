"""What a service's queued backlog costs every new submission: single-job REST POSTs from 8
client threads, with no worker running, at several depths of queued jobs of the same service
(rows copied from one submitted job). Per depth: POSTs/s, POST p50 and CPU per POST of the web
and PostgreSQL; then a client's GETs of one of its queued jobs, one after another (p50, the
slowest, and web and PostgreSQL CPU per GET). Two backlogs:

- `own` (the default): the posting tenant's own jobs, max_queue_size lifted;
- `bulk`: another tenant's bulk job's pieces, which admission lets past max_queue_size (a bulk
  is admitted by its own budget), with config.yaml's max_queue_size: what a big job does to
  everyone else's submissions to its service.

The queue's admission check (`renq_admit_to_queue`) counts the service's queued jobs by tenant
under the service's advisory lock, so whatever it reads every submitter of the service waits
for in turn.

    .venv/bin/python bench/admission_depth.py [--backlog own|bulk] [--depths 0 5000 20000 50000]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402  (the bench's own stores, before Django)

SERVICE = "bench-admission"
CLIENTS = 8
# GETs of one of the posting tenant's queued jobs per depth (its page explains its wait).
LOOKS = 50


def _fill_queue(template_id: str, depth: int, owner_id: int | None) -> None:
    """Queued copies of the template job until the service has `depth` queued jobs; with
    `owner_id`, that tenant's, as pieces of the template (a bulk job's)."""
    from django.db import connection

    from inference.models import Job

    missing = depth - Job.objects.filter(service__name=SERVICE, status="queued").count()
    if missing <= 0:
        return
    fixed = {"tenant_id": owner_id, "parent_id": template_id} if owner_id else {}
    columns = [
        f.column for f in Job._meta.concrete_fields if f.column not in ("id", "created_at", *fixed)
    ]
    listed = ", ".join(f'"{c}"' for c in [*columns, *fixed])
    copied = ", ".join([*(f'"{c}"' for c in columns), *("%s" for _ in fixed)])
    with connection.cursor() as cursor:
        cursor.execute(
            f'INSERT INTO {Job._meta.db_table} ("id", "created_at", {listed}) '
            # Each copy its own created_at, as jobs posted one by one have.
            f"SELECT gen_random_uuid(), now() - g * interval '1 microsecond', {copied} "
            f"FROM {Job._meta.db_table}, generate_series(1, %s) AS g WHERE id = %s",
            [*fixed.values(), missing, template_id],
        )
        # A backlog that has waited a while: its rows vacuumed, so the fill's own upkeep
        # (autovacuum) does not run in the measurement.
        cursor.execute(f"VACUUM ANALYZE {Job._meta.db_table}")


def _posts(url: str, key: str, count: int) -> tuple[float, list[float]]:
    """`count` single-job POSTs from CLIENTS threads: (seconds, latencies in ms)."""
    latencies: list[float] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        poster = common.JsonPoster(url, key)
        for i in range(count // CLIENTS):
            body = {"service": SERVICE, "priority": "api", "input": {"texts": [f"d {k} {i}"]}}
            started = time.perf_counter()
            status, _, answer = poster.post("/api/v1/jobs", body)
            if status != 202:
                raise RuntimeError(f"POST answered {status}: {answer[:300]!r}")
            with lock:
                latencies.append((time.perf_counter() - started) * 1000)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(CLIENTS)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started, latencies


def _looks(url: str, key: str, job_id: str, count: int) -> list[float]:
    """`count` GETs of one queued job, one after another: latencies in ms."""
    poster = common.JsonPoster(url, key)
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        status, _, answer = poster.get(f"/api/v1/jobs/{job_id}")
        if status != 200 or json.loads(answer)["wait"] is None:
            raise RuntimeError(f"GET answered {status}: {answer[:300]!r}")
        latencies.append((time.perf_counter() - started) * 1000)
    return latencies


def run(depths: list[int], posts: int, backlog: str) -> dict:
    import django

    django.setup()
    common.ensure_database()
    common.clear_jobs()
    from processes import ProcessGroup, free_port

    from bench.cpu import CpuMeter
    from inference.dispatch.queues import service_queues
    from inference.models import Job

    if backlog == "bulk":
        limit = common.shipped_runtime("embedding")["max_queue_size"]
        common.embedding_service(SERVICE, max_queue_size=limit)
        owner, owner_key = common.bench_tenant("bench-bulk")
    else:
        common.embedding_service(SERVICE)
        owner, owner_key = None, ""
    _, key = common.bench_tenant()
    queues = service_queues(SERVICE)
    results: dict = {"clients": CLIENTS, "posts_per_depth": posts, "backlog": backlog, "depths": {}}
    with ProcessGroup() as procs:
        url = procs.web(free_port(), workers=1)
        poster = common.JsonPoster(url, owner_key or key)
        status, _, answer = poster.post(
            "/api/v1/jobs", {"service": SERVICE, "input": {"texts": ["template"]}}
        )
        if status != 202:
            raise RuntimeError(f"POST answered {status}: {answer[:300]!r}")
        template = json.loads(answer)["id"]
        _posts(url, key, 80)  # warm-up
        for depth in sorted(depths):
            _fill_queue(template, depth, owner.pk if owner else None)
            common.purge_queues(queues)  # the messages are not what is measured
            meter = CpuMeter(common.DB_NAME, {"web": procs.procs["web"].pid})
            meter.start()
            seconds, latencies = _posts(url, key, posts)
            cpu = meter.stop()
            done = len(latencies)
            mine = Job.objects.filter(service__name=SERVICE, status="queued").exclude(
                tenant__name="bench-bulk"
            )
            meter = CpuMeter(common.DB_NAME, {"web": procs.procs["web"].pid})
            meter.start()
            looks = _looks(url, key, str(mine.latest("created_at").pk), LOOKS)
            looked = meter.stop()
            results["depths"][depth] = {
                "posts_s": round(done / seconds, 1),
                "post_ms_p50": round(statistics.median(latencies), 2),
                "post_ms_p99": round(common.pct(latencies, 99), 2),
                "web_cpu_ms_per_post": round(1000 * cpu["web_s"] / done, 3),
                "postgres_cpu_ms_per_post": round(1000 * cpu["postgres_s"] / done, 3),
                "get_ms_p50": round(statistics.median(looks), 2),
                "get_ms_max": round(max(looks), 2),
                "web_cpu_ms_per_get": round(1000 * looked["web_s"] / LOOKS, 3),
                "postgres_cpu_ms_per_get": round(1000 * looked["postgres_s"] / LOOKS, 3),
            }
            print(depth, results["depths"][depth], flush=True)
            if owner:
                # The posting tenant's own room is the queue less the bulk's share: the next
                # depth starts from an empty line of its own.
                Job.objects.filter(service__name=SERVICE).exclude(tenant=owner).exclude(
                    pk=template
                ).delete()
        common.purge_queues(queues)
    common.clear_jobs()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backlog", choices=("own", "bulk"), default="own")
    parser.add_argument("--depths", type=int, nargs="+", default=[0, 5_000, 20_000, 50_000])
    parser.add_argument(
        "--posts", type=int, help="per depth (1,200; with --backlog bulk 320, which fit)"
    )
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args()
    posts = args.posts or (320 if args.backlog == "bulk" else 1200)
    common.print_and_keep(run(args.depths, posts, args.backlog), args.out)


if __name__ == "__main__":
    main()
