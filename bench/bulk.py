"""A 10,000-text bulk job (POST /api/v1/jobs/bulk, the shipped embedding settings, real MiniLM)
against the raw model batched in-process on the same number of threads.

The raw rate is measured on the same texts in pieces of the service's batch size, half before
and half after the bulk job (so a change in what else the machine runs shows in both), while
the worker is idle; the bulk job's rate is texts ÷ (parent finished − POST sent).
"""

from __future__ import annotations

import time

import requests

from bench.common import (
    embedding_service,
    on_model_cores,
    run_nonce,
    short_texts,
    wait_finished,
)

SERVICE = "bench-embedding"


def raw_rate(engine, texts: list[str], batch: int) -> tuple[int, float]:
    with on_model_cores():
        started = time.perf_counter()
        for i in range(0, len(texts), batch):
            engine.run_batch([{"texts": texts[i : i + batch], "normalize": True}])
        return len(texts), time.perf_counter() - started


def run(url: str, key: str, engine, *, quick: bool) -> dict:
    from inference.models import Job

    service = embedding_service(SERVICE)
    n = 2_000 if quick else 10_000
    raw_n = 300 if quick else 400  # before and after each
    nonce = run_nonce()
    texts = [f"{nonce} {t}" for t in short_texts(n, seed=21)]
    batch = service.batch_size

    n1, s1 = raw_rate(engine, texts[:raw_n], batch)
    session = requests.Session()
    session.headers["Authorization"] = f"Bearer {key}"
    t0 = time.time()
    r = session.post(
        f"{url}/api/v1/jobs/bulk",
        json={"service": SERVICE, "priority": "batch", "input": {"texts": texts}},
        timeout=300,
    )
    accepted_s = time.time() - t0
    r.raise_for_status()
    parent = Job.objects.filter(pk=r.json()["id"])
    wait_finished(parent, 1, timeout_s=900, poll_s=0.5)
    parent_row = parent.get()
    span = parent_row.finished_at.timestamp() - t0
    pieces = list(Job.objects.filter(parent=parent_row).values_list("inference_ms", "batch_size"))
    n2, s2 = raw_rate(engine, texts[raw_n : 2 * raw_n], batch)
    raw_texts_s = (n1 + n2) / (s1 + s2)
    model_s = sum(ms or 0 for ms, _ in pieces) / 1000
    return {
        "texts": n,
        "status": parent_row.status,
        "pieces": len(pieces),
        "texts_per_piece": batch,
        "jobs_per_batch_p50": sorted(b or 0 for _, b in pieces)[len(pieces) // 2],
        "post_s": round(accepted_s, 3),
        "seconds": round(span, 2),
        "texts_s": n / span,
        "raw_texts_s": raw_texts_s,
        "raw_before_texts_s": n1 / s1,
        "raw_after_texts_s": n2 / s2,
        "ratio": (n / span) / raw_texts_s,
        "model_busy_fraction": model_s / span,
    }
