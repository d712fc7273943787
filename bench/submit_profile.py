"""Where a POST /api/v1/jobs spends its time: single-job POSTs handled in-process by Django's
test client (the full middleware + DRF + submit path, against the real Postgres, RabbitMQ and
Redis of the bench), profiled with pyinstrument. Writes bench/results/submit_profile.txt:

- ms per POST in-process (wall and this process's CPU), unprofiled;
- the time by layer (the innermost frame's library: Postgres round trips, ORM, DRF, …);
- the time by renq function (each sample charged to the innermost frame of renq's own code);
- the top frames by self time, and the call tree.

The profile is wall time of one thread: time spent waiting for Postgres, RabbitMQ or Redis to
answer shows as the frame that waits (e.g. psycopg2's execute, amqp's read). The test client
adds a little of its own (request building), listed as such.

    .venv/bin/python bench/submit_profile.py [--posts 300]
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path

if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS, bench_tenant, purge_queues  # noqa: E402

OWN_CODE = ("/inference/", "/routing/", "/renq_site/")
# The innermost frame's file → the layer its time belongs to (first match wins).
LAYERS = (
    ("/django/test/", "test client (not in production)"),
    ("/psycopg2/", "Postgres: round trips (psycopg2)"),
    ("/django/db/backends/", "Postgres: round trips (psycopg2)"),
    ("/django/db/models/", "Django ORM: building queries and model instances"),
    ("/django/db/", "Django ORM: transactions and connections"),
    ("/amqp/", "RabbitMQ: AMQP frames and confirms (py-amqp)"),
    ("/kombu/", "RabbitMQ: kombu (publish, channels)"),
    ("/celery/", "Celery: building task messages"),
    ("/redis/", "Redis (redis-py)"),
    ("/rest_framework/", "DRF: request, parsing, authentication, serializers"),
    ("/drf_spectacular/", "drf-spectacular"),
    ("/django/", "Django: handler, middleware, signals, responses"),
    ("/json/", "JSON"),
    ("/inference/", "renq: inference"),
    ("/routing/", "renq: routing"),
    ("/renq_site/", "renq: renq_site (middleware, settings)"),
    ("/uuid.py", "uuid"),
    ("/logging/", "logging"),
)


def _layer(path: str) -> str:
    for needle, name in LAYERS:
        if needle in path:
            return name
    return "other (stdlib, C calls)"


def _walk(frame, stack, by_layer, by_owner, by_self):
    if frame.is_synthetic:
        return  # "[self]" leaves: already in their parent's total_self_time
    own = [f for f in stack + [frame] if any(p in (f.file_path or "") for p in OWN_CODE)]
    owner = own[-1] if own else None
    owner_name = (
        f"{_short(owner.file_path)}:{owner.function}" if owner is not None else "(outside renq)"
    )
    self_time = frame.total_self_time
    if self_time > 0:
        # A C function (no file) belongs to the library that called it.
        path = _real_path(frame) or next(
            (_real_path(f) for f in reversed(stack) if _real_path(f)), ""
        )
        where = _short(path) if _real_path(frame) else f"called from {_short(path)}"
        by_layer[_layer(path)] += self_time
        by_owner[owner_name] += self_time
        by_self[f"{frame.function}  ({where})"] += self_time
    for child in frame.children:
        _walk(child, stack + [frame], by_layer, by_owner, by_self)


def _real_path(frame) -> str:
    path = frame.file_path or ""
    return "" if path.startswith("<") else path


def _short(path: str | None) -> str:
    if not path:
        return "?"
    for marker in ("site-packages/", "/work/main/", "/lib/python3"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _table(title: str, rows: dict[str, float], total: float, per_post: float, limit: int) -> list:
    lines = [title, "-" * len(title)]
    lines.append(f"{'% of time':>9}  {'ms/POST':>8}  what")
    for name, seconds in sorted(rows.items(), key=lambda kv: -kv[1])[:limit]:
        lines.append(f"{100 * seconds / total:8.1f}%  {1000 * seconds / per_post:8.2f}  {name}")
    return lines + [""]


def run(*, posts: int = 300, out: Path | None = None) -> dict:
    from django.test import Client
    from pyinstrument import Profiler

    from bench.noop_throughput import SERVICE, noop_service
    from inference.dispatch.queues import service_queues

    noop_service()
    purge_queues(service_queues(SERVICE))  # no worker here: the messages are dropped after
    _, key = bench_tenant()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")

    def post(i: int) -> None:
        body = {"service": SERVICE, "priority": "api", "input": {"texts": [f"profiled {i}"]}}
        r = client.post("/api/v1/jobs", data=json.dumps(body), content_type="application/json")
        if r.status_code != 202:
            raise RuntimeError(f"POST answered {r.status_code}: {r.content[:300]!r}")

    for i in range(30):  # warm-up: imports, connections, caches
        post(i)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    for i in range(posts):
        post(1000 + i)
    wall_ms = 1000 * (time.perf_counter() - wall0) / posts
    cpu_ms = 1000 * (time.process_time() - cpu0) / posts

    profiler = Profiler(interval=0.0005, async_mode="disabled")
    profiler.start()
    for i in range(posts):
        post(10_000 + i)
    session = profiler.stop()
    purge_queues(service_queues(SERVICE))

    root = session.root_frame()
    by_layer: dict[str, float] = defaultdict(float)
    by_owner: dict[str, float] = defaultdict(float)
    by_self: dict[str, float] = defaultdict(float)
    _walk(root, [], by_layer, by_owner, by_self)
    total = sum(by_layer.values())
    lines = [
        "renq submit path profile: POST /api/v1/jobs, one no-op job per request",
        "=" * 70,
        "",
        "In-process (Django test client → middleware → DRF → submit_job → Postgres, RabbitMQ,",
        f"Redis), {posts} POSTs after 30 warm-up, unprofiled: {wall_ms:.2f} ms wall and "
        f"{cpu_ms:.2f} ms CPU of this process per POST",
        "(wall − CPU ≈ waiting for Postgres/RabbitMQ/Redis to answer; their own CPU is not in",
        "these figures, see the no-op run's CPU by process in README.md).",
        f"Profiled run: {posts} POSTs, {session.duration:.2f} s, pyinstrument "
        f"{session.sample_count} samples at 0.5 ms (wall time).",
        "",
    ]
    lines += _table("Time by layer (innermost frame's library)", by_layer, total, posts, 30)
    lines += _table(
        "Time by renq function (innermost renq frame on the stack, library calls included)",
        by_owner,
        total,
        posts,
        30,
    )
    lines += _table("Top frames by self time", by_self, total, posts, 40)
    tree = profiler.output_text(unicode=False, color=False, show_all=False)
    lines += ["Call tree (pyinstrument, frames under ~1 % hidden)", "-" * 50, tree]
    text = "\n".join(lines) + "\n"
    out = out or RESULTS / "submit_profile.txt"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return {
        "posts": posts,
        "in_process_ms_per_post": round(wall_ms, 3),
        "in_process_cpu_ms_per_post": round(cpu_ms, 3),
        "by_layer_ms_per_post": {
            name: round(1000 * s / posts, 3)
            for name, s in sorted(by_layer.items(), key=lambda kv: -kv[1])
        },
        "by_function_ms_per_post": {
            name: round(1000 * s / posts, 3)
            for name, s in sorted(by_owner.items(), key=lambda kv: -kv[1])[:12]
        },
        "file": str(out.relative_to(RESULTS.parent.parent))
        if out.is_relative_to(RESULTS)
        else str(out),
    }


if __name__ == "__main__":
    import argparse

    import django

    parser = argparse.ArgumentParser()
    parser.add_argument("--posts", type=int, default=300)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    django.setup()
    from bench.common import ensure_database

    ensure_database()
    print(json.dumps(run(posts=args.posts, out=args.out), indent=2))
