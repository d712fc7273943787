"""The front door under a retrying client: an Idempotency-Key gives a retried request the job
its first attempt made (waiting for it, or answering with it), and X-Renq-Deadline-Ms only
ever shortens the wait (never past the service's total_timeout)."""

from __future__ import annotations

import time

import pytest
import requests
from django.utils import timezone

from inference.intake.submission import MAX_DEADLINE_MS
from inference.models import Job, JobStatus

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def slow_reranker(make_service) -> str:
    """A reranker no worker consumes, whose answers are promised within 0.3 s."""
    return make_service("reranker", name="slow-reranker", total_timeout=0.3).name


def _rerank(url: str, key: str, body: dict, **headers) -> requests.Response:
    return requests.post(
        f"{url}/v1/rerank",
        json=body,
        headers={"Authorization": f"Bearer {key}", **headers},
        timeout=20,
    )


def test_a_retried_request_gets_the_job_its_first_attempt_made(
    front_door_url, tenant_key, slow_reranker
):
    body = {"model": slow_reranker, "query": "cats", "documents": ["a cat", "tax forms"]}
    first = _rerank(front_door_url, tenant_key, body, **{"Idempotency-Key": "rr-1"})
    assert first.status_code == 504, first.text  # nobody ran it in time
    job_id = first.headers["X-Renq-Job-Id"]
    # A worker answers it after all; the client retries with the same key.
    now = timezone.now()
    Job.objects.filter(pk=job_id).update(
        status=JobStatus.SUCCEEDED,
        result={"scores": [0.9, 0.1], "ranking": [0, 1]},
        started_at=now,
        finished_at=now,
    )
    again = _rerank(front_door_url, tenant_key, body, **{"Idempotency-Key": "rr-1"})
    assert again.status_code == 200, again.text
    assert again.headers["X-Renq-Job-Id"] == job_id
    assert [r["index"] for r in again.json()["results"]] == [0, 1]
    assert Job.objects.count() == 1


def test_a_retry_waits_for_the_same_job_and_another_request_is_refused(
    front_door_url, tenant_key, slow_reranker
):
    body = {"model": slow_reranker, "query": "cats", "documents": ["a cat"]}
    answers = [_rerank(front_door_url, tenant_key, body, **{"Idempotency-Key": "rr-2"})
               for _ in range(2)]  # fmt: skip
    assert [a.status_code for a in answers] == [504, 504]
    assert answers[0].headers["X-Renq-Job-Id"] == answers[1].headers["X-Renq-Job-Id"]
    other = _rerank(
        front_door_url, tenant_key, {**body, "query": "dogs"}, **{"Idempotency-Key": "rr-2"}
    )
    assert other.status_code == 400, other.text
    assert other.json()["error"]["param"] == "Idempotency-Key"
    assert Job.objects.count() == 1


def test_the_deadline_header_never_waits_past_total_timeout(
    front_door_url, tenant_key, slow_reranker
):
    body = {"model": slow_reranker, "query": "cats", "documents": ["a cat"]}
    started = time.monotonic()
    response = _rerank(
        front_door_url, tenant_key, body, **{"X-Renq-Deadline-Ms": str(MAX_DEADLINE_MS)}
    )
    waited_s = time.monotonic() - started
    assert response.status_code == 504, response.text
    assert waited_s < 5  # total_timeout (0.3 s) and the verdict's grace, not a week
    assert "within 0.3 s" in response.json()["error"]["message"]
    job = Job.objects.get(pk=response.headers["X-Renq-Job-Id"])
    assert (job.deadline_at - job.created_at).total_seconds() == pytest.approx(0.3)
    # The client's own deadline has not passed: the job is left to run, as without the header.
    assert job.status == JobStatus.QUEUED


def test_a_sooner_deadline_header_still_shortens_the_wait(
    front_door_url, tenant_key, make_service
):
    service = make_service("reranker", name="patient-reranker", total_timeout=60).name
    body = {"model": service, "query": "cats", "documents": ["a cat"]}
    started = time.monotonic()
    response = _rerank(front_door_url, tenant_key, body, **{"X-Renq-Deadline-Ms": "300"})
    assert response.status_code == 504 and time.monotonic() - started < 5
    job = Job.objects.get(pk=response.headers["X-Renq-Job-Id"])
    assert job.status == JobStatus.CANCELLED  # the client's deadline passed
