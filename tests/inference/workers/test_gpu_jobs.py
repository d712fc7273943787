"""The core slice end to end: REST → Postgres → RabbitMQ tier queue → real Celery worker process
running the real all-MiniLM-L6-v2 → result read back over REST."""

from __future__ import annotations

import math

import pytest

from inference.dispatch.publishing import publish
from inference.models import Job, JobStatus
from tests.conftest import wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def cosine(a, b):
    return sum(x * y for x, y in zip(a, b, strict=True)) / (
        math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    )


def test_submitted_job_gets_a_real_normalised_embedding(celery_worker_process, api, make_service):
    make_service("embedding", normalize_embeddings=True)
    response = api.post(
        "/api/v1/jobs",
        {
            "service": "embedding",
            "priority": "realtime",
            "input": {"texts": ["a cat sits on the mat", "a cat sits on the mat", "tax forms"]},
        },
        format="json",
    )
    assert response.status_code == 202
    job = wait_for_job(response.json()["id"])
    assert job.status == JobStatus.SUCCEEDED, job.error

    body = api.get(f"/api/v1/jobs/{job.pk}").json()
    vectors = body["result"]["embeddings"]
    assert body["result"]["dim"] == 384
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert all(abs(math.sqrt(sum(x * x for x in v)) - 1) < 1e-4 for v in vectors)
    assert vectors[0] == vectors[1]
    assert cosine(vectors[0], vectors[2]) < 0.5  # a real model, not a stub
    assert body["queue_wait_ms"] >= 0 and body["inference_ms"] > 0
    # started_at is the forward pass's start: the pass fits between it and finished_at.
    assert (job.finished_at - job.started_at).total_seconds() * 1000 >= job.inference_ms - 1
    # A realtime pass may begin before its claim returns (early_pass), never before the job
    # was submitted.
    assert job.created_at <= job.started_at


def test_unnormalised_service_returns_raw_mean_pooled_vectors(
    celery_worker_process, make_tenant, make_service
):
    from inference.intake.submission import submit_job

    make_service("embedding", normalize_embeddings=False)
    tenant, _ = make_tenant()
    job = submit_job(tenant=tenant, service_name="embedding", payload={"texts": ["hello world"]})
    job = wait_for_job(job.pk)
    norm = math.sqrt(sum(x * x for x in job.embedding_matrix().tolist()[0]))
    assert abs(norm - 1) > 0.01


def _queued_job_without_message(tenant, service):
    # Created directly, so no on_commit publish: the test controls every message.
    return Job.objects.create(tenant=tenant, service=service, tier="api", input={"texts": ["dup"]})


def test_duplicate_messages_run_the_job_once(celery_worker_process, make_tenant, make_service):
    service = make_service("embedding")
    tenant, _ = make_tenant()
    job = _queued_job_without_message(tenant, service)
    for _ in range(3):
        assert publish(job)
    job = wait_for_job(job.pk)
    assert job.status == JobStatus.SUCCEEDED
    started, finished = job.started_at, job.finished_at
    # A marker job behind the duplicates: once it is done, every duplicate was consumed.
    marker = _queued_job_without_message(tenant, service)
    publish(marker)
    wait_for_job(marker.pk)
    job.refresh_from_db()
    assert job.attempts == 1
    assert (job.started_at, job.finished_at) == (started, finished)


def test_cancelled_before_the_worker_reaches_it_never_runs(
    celery_worker_process, api, make_service
):
    service = make_service("embedding")
    job = _queued_job_without_message(api.tenant, service)
    assert api.delete(f"/api/v1/jobs/{job.pk}").status_code == 200
    publish(job)
    marker = _queued_job_without_message(api.tenant, service)
    publish(marker)
    wait_for_job(marker.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    assert job.attempts == 0 and job.started_at is None and job.result is None
