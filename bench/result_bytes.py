"""Bytes per embedding job, before and after vectors were stored as float32 (issue 9, item 4).

For a 1-text and a 16-text MiniLM job (384 dims), the same vectors stored both ways in the
bench database:

- before: the JSON result the worker used to write, `{"embeddings": [[float]], "dim"}` as
  json.dumps printed it, in the `result` jsonb column;
- after: the real store path (`Job.objects.store_outcomes`): `{"dim", "count"}` in `result`,
  the vectors as little-endian float32 in `result_vectors` (bytea).

Per job: `pg_column_size` of result + result_vectors (what the row holds, after TOAST
compression), the store's parameters as psycopg2 sends them (text protocol: bytea goes as hex),
the worker's CPU to turn the engine's output into them, and the REST body of
GET /api/v1/jobs/<id> with float lists (the same bytes before and after: checked) and with
`?encoding_format=base64`.

Usage: python bench/result_bytes.py [--out FILE]   (RENQ_BENCH_DATABASE_URL picks the database)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.common import MODEL_REF, bench_tenant, embedding_service, short_texts  # noqa: E402

SERVICE = "bench-result-bytes"
SIZES = (1, 16)
TIMING_REPEATS = 200


def _column_sizes(job_id) -> dict:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """SELECT coalesce(pg_column_size(result), 0),
                      coalesce(pg_column_size(result_vectors), 0),
                      coalesce(octet_length(result::text), 0),
                      coalesce(octet_length(result_vectors), 0)
                 FROM inference_job WHERE id = %s""",
            [job_id],
        )
        result, vectors, result_raw, vectors_raw = cursor.fetchone()
    return {
        "stored_bytes": result + vectors,
        "result_column": result,
        "result_vectors_column": vectors,
        "uncompressed_bytes": result_raw + vectors_raw,
    }


def _cpu_ms(fn) -> float:
    started = time.process_time()
    for _ in range(TIMING_REPEATS):
        fn()
    return round(1000 * (time.process_time() - started) / TIMING_REPEATS, 4)


def _sent_bytes(*params) -> int:
    """What psycopg2 puts into the statement for these parameters (text protocol)."""
    from django.db import connection
    from psycopg2 import Binary

    with connection.cursor() as cursor:
        adapted = [Binary(p) if isinstance(p, bytes) else p for p in params]
        return len(cursor.cursor.mogrify(",".join(["%s"] * len(adapted)), adapted))


def measure(engine, tenant, service, client, n: int) -> dict:
    from django.db import connection

    from inference.jobs.transitions import Outcome
    from inference.jobs.vectors import split_result
    from inference.models import Job

    texts = short_texts(n, seed=100 + n)
    output = engine.run_batch([{"texts": texts, "normalize": True}])[0]

    def old_json() -> str:  # what store_outcomes wrote before: the engine's floats as JSON
        return json.dumps({"embeddings": output["embeddings"].tolist(), "dim": output["dim"]})

    def new_split() -> tuple:
        result, vectors = split_result(output)
        return json.dumps(result), vectors

    fields = {"tenant": tenant, "service": service, "tier": "batch", "input": {"texts": texts}}
    before, after = Job.objects.create(**fields), Job.objects.create(**fields)
    claim = Job.objects.claim([before.pk, after.pk], worker="bench")
    outcomes = [Outcome(job=job, result=output, inference_ms=1.0) for job in claim.jobs]
    assert Job.objects.store_outcomes(claim.token, outcomes) == 2
    # The row as the worker wrote it before: the floats in the JSON column, no bytes.
    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE inference_job SET result = %s::jsonb, result_vectors = NULL WHERE id = %s",
            [old_json(), before.pk],
        )

    def body(job, query: str = "") -> bytes:
        response = client.get(f"/api/v1/jobs/{job.pk}{query}")
        assert response.status_code == 200, response.content[:300]
        return response.content

    def result_of(content: bytes) -> dict:
        return json.loads(content)["result"]

    # The float answer is the same before and after; base64 decodes to the same values.
    assert result_of(body(before)) == result_of(body(after))
    base64_body = body(after, "?encoding_format=base64")
    return {
        "texts": n,
        "dim": output["dim"],
        "before": {
            **_column_sizes(before.pk),
            "sent_to_postgres_bytes": _sent_bytes(old_json()),
            "worker_cpu_ms": _cpu_ms(old_json),
            "rest_float_body_bytes": len(body(before)),
        },
        "after": {
            **_column_sizes(after.pk),
            "sent_to_postgres_bytes": _sent_bytes(*new_split()),
            "worker_cpu_ms": _cpu_ms(new_split),
            "rest_float_body_bytes": len(body(after)),
            "rest_base64_body_bytes": len(base64_body),
        },
    }


def run(engine=None) -> dict:
    from django.test import Client

    from inference.engines import load_engine
    from inference.models import Job

    engine = engine or load_engine("embedding", MODEL_REF, device="cpu")
    service = embedding_service(SERVICE)
    tenant, key = bench_tenant("result-bytes")
    Job.objects.filter(tenant=tenant).delete()
    client = Client(HTTP_AUTHORIZATION=f"Bearer {key}")
    return {f"{n}_texts": measure(engine, tenant, service, client, n) for n in SIZES}


def report(results: dict) -> str:
    lines = ["Bytes per embedding job (MiniLM, 384 dims): before (JSON floats) → after (float32)"]
    rows = [
        ("stored in PostgreSQL (pg_column_size)", "stored_bytes"),
        ("  uncompressed", "uncompressed_bytes"),
        ("sent to PostgreSQL by the store", "sent_to_postgres_bytes"),
        ("REST GET body, float", "rest_float_body_bytes"),
    ]
    for case in results.values():
        before, after = case["before"], case["after"]
        lines.append(f"\n{case['texts']} text(s):")
        for label, key in rows:
            ratio = before[key] / after[key] if after[key] else float("nan")
            lines.append(f"  {label:<40} {before[key]:>9,} → {after[key]:>9,}  ({ratio:.1f}×)")
        lines.append(
            f"  {'REST GET body, ?encoding_format=base64':<40} {'':>9}   "
            f"{after['rest_base64_body_bytes']:>9,}"
        )
        lines.append(
            f"  {'worker CPU to prepare the store (ms)':<40} {before['worker_cpu_ms']:>9} → "
            f"{after['worker_cpu_ms']:>9}"
        )
    return "\n".join(lines)


def main() -> int:
    import django

    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    django.setup()
    from bench import common

    common.ensure_database()
    import torch

    torch.set_num_threads(common.MODEL_THREADS)
    results = run()
    text = report(results)
    print(text)
    print(json.dumps(results, indent=2))
    if args.out:
        args.out.write_text(text + "\n\n" + json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
