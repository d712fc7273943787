"""A tenant whose realtime or api jobs a GPU worker claims after more than half their
queue_timeout, with more of them still queued behind, gets 503 with Retry-After for new jobs of
that line, rather than 202 for jobs that would expire in the queue; other tenants, the tenant's
other tiers, jobs the router sends to a cloud backend, and the line itself once its jobs start
in time again are accepted. Real Postgres and Redis; the claim is the worker's own (`note_claim`
runs after every claim of a GPU worker)."""

from __future__ import annotations

import math
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from inference.intake import overdue
from inference.models import Job
from inference.workers.gpu.intake import note_claim
from inference.workers.gpu.report import BatchReport
from tests.inference.dispatch.test_queue_position import measured

pytestmark = pytest.mark.django_db

QUEUE_TIMEOUT_S = 2.0


@pytest.fixture(autouse=True)
def held_for_the_test(monkeypatch):
    """A late claim's mark outlasts a test's few submissions on a busy machine (the shipped
    hold is a quarter second); the test of its lapse sets its own."""
    monkeypatch.setattr(overdue, "OVERDUE_HOLD_MS", 5_000)


@pytest.fixture
def embedding(make_service):
    return make_service("embedding", queue_timeout=QUEUE_TIMEOUT_S, total_timeout=5.0)


def submit(client, priority: str = "api"):
    body = {"service": "embedding", "priority": priority, "input": {"texts": ["hello"]}}
    return client.post("/api/v1/jobs", body, format="json")


def accepted_ago(job_id: str, seconds: float) -> None:
    Job.objects.filter(pk=job_id).update(created_at=timezone.now() - timedelta(seconds=seconds))


def claimed_after(job_id: str, waited_s: float):
    """A worker claims the job `waited_s` after it was accepted."""
    accepted_ago(job_id, waited_s)
    claim = Job.objects.claim([job_id], worker="test-worker")
    note_claim(claim, BatchReport())
    return claim


def client_of(make_tenant, name: str) -> APIClient:
    _, key = make_tenant(name)
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    return client


def late_with_a_backlog(client, priority: str = "api", waited_s: float = 1.5, queued: int = 1):
    """The line's first job is claimed `waited_s` after it was accepted, `queued` more accepted
    just after it still queued."""
    first, *behind = [submit(client, priority).json()["id"] for _ in range(queued + 1)]
    for job_id in behind:
        accepted_ago(job_id, waited_s - 0.01)
    return claimed_after(first, waited_s)


def test_a_late_claim_refuses_the_lines_new_jobs_with_503_and_retry_after(api, embedding):
    assert late_with_a_backlog(api).jobs  # claimed in time, but late in its queue_timeout
    stored = Job.objects.count()

    response = submit(api)

    assert response.status_code == 503, response.content
    # Not before the mark's hold has passed (less the moments since the claim); whole seconds
    # for clients that read no other.
    retry_ms = int(response["retry-after-ms"])
    assert overdue.OVERDUE_HOLD_MS - 1_000 < retry_ms <= overdue.OVERDUE_HOLD_MS
    assert response["Retry-After"] == str(math.ceil(retry_ms / 1000))
    error = response.json()["error"]
    assert error["quota"] == "queue_timeout"
    assert "would expire in the queue" in error["fields"]["service"][0]
    assert Job.objects.count() == stored  # nothing accepted, nothing to expire


def retry_after_ms(client) -> int:
    response = submit(client)
    assert response.status_code == 503, response.content
    return int(response["retry-after-ms"])


def test_the_refusal_says_when_the_line_should_take_work_again(api, embedding, monkeypatch):
    monkeypatch.setattr(overdue, "OVERDUE_HOLD_MS", 250)
    measured(embedding, 4.0)
    assert late_with_a_backlog(api, queued=24).jobs

    response = submit(api)

    assert response.status_code == 503, response.content
    # Its 24 queued jobs but the last batch (8) drain in 4 s at 4 jobs/s, and the client comes
    # back half that batch (1 s) later: while that batch still waits, not to an idle model,
    # nor to be refused again meanwhile.
    assert 4_000 < int(response["retry-after-ms"]) <= 5_000
    assert response["Retry-After"] == "5"


def test_a_line_one_batch_from_empty_is_refused_for_the_hold(api, embedding):
    measured(embedding, 4.0)
    assert late_with_a_backlog(api, queued=8).jobs  # its batch, 8 jobs, is all that waits

    assert overdue.OVERDUE_HOLD_MS - 1_000 < retry_after_ms(api) <= overdue.OVERDUE_HOLD_MS


def test_each_late_claim_predicts_the_lapse_again(api, embedding, monkeypatch):
    monkeypatch.setattr(overdue, "OVERDUE_HOLD_MS", 250)
    measured(embedding, 4.0)
    late_with_a_backlog(api, queued=24)
    first = retry_after_ms(api)
    queued = [
        str(pk)
        for pk in Job.objects.filter(status="queued")
        .order_by("created_at")
        .values_list("pk", flat=True)
    ]

    # It drains slower than predicted: a late claim says so, and the line waits longer.
    measured(embedding, 1.0)
    claimed_after(queued[0], 1.5)
    assert retry_after_ms(api) > first + 5_000

    # The claims of its last batch are late too (its jobs waited through the drain): they end
    # the mark, and the line takes work again while that batch is still queued.
    measured(embedding, 4.0)
    for job_id in queued[1:-8]:
        claimed_after(job_id, 1.5)
    assert Job.objects.filter(status="queued").count() == 8
    assert submit(api).status_code == 202


def test_a_claim_in_time_refuses_nothing(api, embedding):
    late_with_a_backlog(api, waited_s=0.5)

    assert submit(api).status_code == 202


def test_a_job_that_waited_alone_refuses_nothing(api, embedding):
    # A worker starting up claims the first job late; nothing waits behind it.
    first = submit(api).json()["id"]
    claimed_after(first, 1.5)

    assert submit(api).status_code == 202


def test_a_late_job_with_only_fresh_jobs_behind_refuses_nothing(api, embedding):
    # A message left by a stopped worker, claimed late by the next one: the line is short.
    first = submit(api).json()["id"]
    assert submit(api).status_code == 202
    claimed_after(first, QUEUE_TIMEOUT_S + 1)

    assert submit(api).status_code == 202


def test_an_expired_claim_refuses_the_line_too(api, embedding):
    assert late_with_a_backlog(api, waited_s=QUEUE_TIMEOUT_S + 1).expired

    assert submit(api).status_code == 503


def test_other_tenants_and_the_tenants_other_tiers_are_still_accepted(api, embedding, make_tenant):
    late_with_a_backlog(api)

    assert submit(client_of(make_tenant, "quiet")).status_code == 202  # its own line is short
    assert submit(api, "realtime").status_code == 202  # realtime is served ahead of api
    assert submit(api, "batch").status_code == 202  # batch promises no start: never refused
    assert submit(api).status_code == 503


def test_jobs_the_router_sends_to_a_cloud_backend_are_accepted(
    api, embedding, make_backend, make_route
):
    late_with_a_backlog(api)
    make_route(embedding, (make_backend("cloud-embedding"), 0))  # new jobs go to the cloud

    response = submit(api)

    assert response.status_code == 202, response.content
    assert response.json()["backend"] == "cloud-embedding"


def test_batch_work_that_waited_long_marks_nothing(api, embedding):
    late_with_a_backlog(api, "batch", waited_s=60)

    assert submit(api, "batch").status_code == 202
    assert submit(api).status_code == 202


def test_the_line_is_accepted_again_once_no_claim_is_late(api, embedding, monkeypatch):
    monkeypatch.setattr(overdue, "OVERDUE_HOLD_MS", 1_000)
    late_with_a_backlog(api)
    assert submit(api).status_code == 503

    time.sleep(1.0 + 2 * overdue.CHECK_REUSE_S)  # no late claim renewed the mark

    assert submit(api).status_code == 202


def test_a_client_back_when_it_was_told_is_taken(api, embedding, monkeypatch):
    # The web reads a line's mark at most every CHECK_REUSE_S: that reading must not refuse a
    # client that waited exactly as long as it was told.
    monkeypatch.setattr(overdue, "OVERDUE_HOLD_MS", 300)
    monkeypatch.setattr(overdue, "CHECK_REUSE_S", 60.0)
    late_with_a_backlog(api)
    wait_ms = retry_after_ms(api)

    time.sleep(wait_ms / 1000)

    assert submit(api).status_code == 202
