"""Idle realtime overhead of two checkouts, interleaved request by request (or block by block).

Run to run, the fast path's idle overhead on a shared 2-core machine moves by more than one
change saves. This runs both
checkouts side by side instead: a web process and a worker of each, one embedding service
each, and alternates single-text realtime requests between them (`/v1/embeddings`, then
`POST /api/v1/jobs?wait=`), so both see the same machine at the same moments. Overhead is the
client-observed time minus the raw forward pass of the same texts in this process, as in
bench/fast_path.py. The client is the bench's JsonPoster (http.client, one keep-alive
connection per checkout). With `--block 50`, each checkout gets 50 requests in a row per path:
what a sequential client sees, whose next request meets the tail of its last one.

    git worktree add /tmp/base <commit>
    .venv/bin/python bench/idle_ab.py --base /tmp/base [--requests 300] [--tier api] [--unpinned]
        [--block 50]

The base checkout needs fixtures/models (copy them) and runs on this checkout's .venv.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import common  # noqa: E402  (sets the bench's environment first)

WARM_UP = 20


def _processes_of(checkout: Path):
    """That checkout's scripts/processes.py: its processes start in it, on its code."""
    spec = importlib.util.spec_from_file_location(
        "base_processes", checkout / "scripts" / "processes.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _summary(values: list[float]) -> dict:
    ordered = sorted(values)
    return {
        "p50_ms": round(statistics.median(ordered), 2),
        "p90_ms": round(common.pct(ordered, 90), 2),
        "p99_ms": round(common.pct(ordered, 99), 2),
    }


def _request(poster: common.JsonPoster, path: str, service: str, text: str, tier: str) -> float:
    """One request of one text at `tier`, answered 200: client-observed ms."""
    started = time.perf_counter()
    if path == "v1":
        status, _, answer = poster.post(
            "/v1/embeddings", {"model": service, "input": text}, {"X-Renq-Priority": tier}
        )
    else:
        status, _, answer = poster.post(
            "/api/v1/jobs?wait=10",
            {"service": service, "priority": tier, "input": {"texts": [text]}},
        )
    elapsed_ms = (time.perf_counter() - started) * 1000
    if status != 200:
        raise RuntimeError(f"{poster.host}:{poster.port} {path}: {status} {answer[:300]!r}")
    return elapsed_ms


def run(
    base: Path, requests_each: int, tier: str = "realtime", pinned: bool = True, block: int = 1
) -> dict:
    import django

    django.setup()
    from processes import ProcessGroup, free_port

    from bench.fast_path import raw_forward_ms
    from inference.dispatch.queues import service_queues

    common.ensure_database()
    common.clear_jobs()
    services = {"base": "idle-ab-base", "head": "idle-ab-head"}
    for name in services.values():
        common.embedding_service(name)
        common.purge_queues(service_queues(name))
    _, key = common.bench_tenant()
    nonce = common.run_nonce()
    texts = [f"hello world {nonce} {i}" for i in range(requests_each + WARM_UP)]
    base_processes = _processes_of(base)
    overhead: dict[str, list[float]] = {
        f"{side}_{path}": [] for side in services for path in ("v1", "rest_wait")
    }
    with common.model_on_its_own_cores() if pinned else contextlib.nullcontext():
        raw_ms = statistics.median(raw_forward_ms(texts[:110])[10:])
        with (
            ProcessGroup() as head,
            base_processes.ProcessGroup(env={"PYTHONPATH": str(base)}) as older,
        ):
            urls = {}
            for side, group in (("head", head), ("base", older)):
                urls[side] = group.web(free_port(), workers=1)
                group.worker(
                    services[side], service_queues(services[side]), threads=common.MODEL_THREADS
                )
            posters = {side: common.JsonPoster(urls[side], key) for side in services}
            numbered = list(enumerate(texts))
            for start in range(0, len(numbered), block):
                chunk = numbered[start : start + block]
                for side in ("base", "head") if (start // block) % 2 else ("head", "base"):
                    for path in ("v1", "rest_wait"):
                        for i, text in chunk:
                            elapsed_ms = _request(posters[side], path, services[side], text, tier)
                            if i >= WARM_UP:
                                overhead[f"{side}_{path}"].append(elapsed_ms - raw_ms)
    return {
        "base": str(base),
        "requests_each": requests_each,
        "tier": tier,
        "model_pinned": pinned,
        "block": block,
        "raw_forward_p50_ms": round(raw_ms, 2),
        "overhead": {name: _summary(values) for name, values in overhead.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument("--requests", type=int, default=300, help="per checkout and path")
    parser.add_argument(
        "--tier",
        default="realtime",
        choices=("realtime", "api"),
        help="the requests' tier (api: what a client that names none gets by default)",
    )
    parser.add_argument(
        "--unpinned",
        action="store_true",
        help="the model shares every core with the stack, as the README runs it",
    )
    parser.add_argument(
        "--block",
        type=int,
        default=1,
        help="requests a checkout gets in a row on each path before the other's turn: above "
        "1, each request follows its own checkout's last one at once, as a sequential "
        "client's do (that run's tail of work then shares the machine with it)",
    )
    parser.add_argument("--out", type=Path, help="also write the figures here (JSON)")
    args = parser.parse_args()
    result = run(
        args.base.resolve(), args.requests, args.tier, pinned=not args.unpinned, block=args.block
    )
    common.print_and_keep(result, args.out)


if __name__ == "__main__":
    main()
