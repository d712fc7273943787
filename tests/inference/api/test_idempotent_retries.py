"""An Idempotency-Key makes any submission safe to retry: a single job, a list of jobs and a bulk
job alike come back as first created, with nothing new made; the key sent with a different
request is a 400 naming it."""

from __future__ import annotations

import pytest

from inference.models import AuditEvent, Job

pytestmark = pytest.mark.django_db


def submit(api, body, key: str):
    return api.post("/api/v1/jobs", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def submit_bulk(api, body, key: str):
    return api.post("/api/v1/jobs/bulk", body, format="json", HTTP_IDEMPOTENCY_KEY=key)


@pytest.fixture
def embedding(make_service):
    return make_service("embedding")


def _items(*texts: str) -> list[dict]:
    return [{"service": "embedding", "input": {"texts": [text]}} for text in texts]


def assert_key_refused(response) -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert list(error["fields"]) == ["Idempotency-Key"]
    assert "different request" in error["message"]


def test_a_retried_list_returns_the_same_jobs_and_creates_none(api, embedding):
    items = _items("a", "b", "c")
    items.insert(1, {"service": "embedding", "input": {"texts": []}})  # refused by name
    first = submit(api, items, "list-7")
    again = submit(api, items, "list-7")
    assert (first.status_code, again.status_code) == (202, 200), again.content
    assert again.json() == first.json()  # the same jobs, the same per-item error
    assert (again.json()["accepted"], again.json()["rejected"]) == (3, 1)
    assert Job.objects.count() == 3
    assert AuditEvent.objects.filter(kind="received").count() == 3


def test_a_key_reused_for_a_different_list_is_a_400_and_creates_nothing(api, embedding):
    items = _items("a", "b", "c")
    assert submit(api, items, "list-8").status_code == 202
    for other in (
        items[:2],  # fewer jobs
        items + _items("d"),  # more jobs
        [items[0], items[2], items[1]],  # the same jobs in another order
        _items("a", "b", "z"),  # one job changed
        items[0],  # one job, not a list
    ):
        assert_key_refused(submit(api, other, "list-8"))
    assert Job.objects.count() == 3


def test_a_key_reused_for_a_different_job_is_a_400(api, embedding):
    body = {"service": "embedding", "input": {"texts": ["once"]}}
    first = submit(api, body, "one-9")
    assert first.status_code == 202
    assert_key_refused(submit(api, {**body, "input": {"texts": ["twice"]}}, "one-9"))
    assert_key_refused(submit(api, [body], "one-9"))  # the same job, sent as a list
    assert submit(api, body, "one-9").json()["id"] == first.json()["id"]
    assert Job.objects.count() == 1


def test_a_retried_bulk_returns_the_same_job_and_makes_no_pieces(api, make_service):
    make_service("noop")
    body = {"service": "noop", "input": {"texts": ["a", "b", "c"]}}
    first = submit_bulk(api, body, "bulk-1")
    again = submit_bulk(api, body, "bulk-1")
    assert (first.status_code, again.status_code) == (202, 200), again.content
    assert again.json()["id"] == first.json()["id"] and again.json()["is_bulk"] is True
    made = Job.objects.count()
    assert Job.objects.filter(is_bulk=True).count() == 1
    assert_key_refused(submit_bulk(api, {**body, "input": {"texts": ["a", "b"]}}, "bulk-1"))
    # A key first sent with a bulk job is not a single job's key either.
    assert_key_refused(submit(api, {"service": "noop", "input": {"texts": ["a"]}}, "bulk-1"))
    assert Job.objects.count() == made
