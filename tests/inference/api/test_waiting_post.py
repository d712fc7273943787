"""POST /api/v1/jobs?wait=<s>: one request that submits a job and answers with its result,
through the web server as `make web` runs it and a real GPU worker."""

from __future__ import annotations

import numpy as np
import pytest
import requests

from inference.models import Job, JobStatus

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def _post(url: str, key: str, body, query: str = "?wait=10") -> requests.Response:
    return requests.post(
        f"{url}/api/v1/jobs{query}",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )


def test_a_waiting_post_answers_with_the_result_it_would_read_later(
    gpu_worker, front_door_url, services, tenant_key
):
    body = {"service": "embedding", "priority": "realtime", "input": {"texts": ["a cat", "tax"]}}
    answer = _post(front_door_url, tenant_key, body)

    assert answer.status_code == 200
    waited = answer.json()
    assert waited["status"] == "succeeded" and waited["error"] is None
    assert waited["inference_ms"] > 0 and waited["queue_wait_ms"] >= 0
    read = requests.get(
        f"{front_door_url}/api/v1/jobs/{waited['id']}",
        headers={"Authorization": f"Bearer {tenant_key}"},
        timeout=10,
    ).json()
    assert np.allclose(waited["result"]["embeddings"], read["result"]["embeddings"], atol=0)
    assert waited["result"]["dim"] == read["result"]["dim"]
    assert waited["backend"] == read["backend"]


def test_a_wait_that_runs_out_answers_202_and_the_job_still_runs_later(
    front_door_url, unserved, tenant_key
):
    body = {"service": unserved, "input": {"texts": ["nobody serves this yet"]}}
    answer = _post(front_door_url, tenant_key, body, "?wait=0.3")

    assert answer.status_code == 202
    accepted = answer.json()
    assert accepted["status"] == "queued"
    assert Job.objects.get(pk=accepted["id"]).status == JobStatus.QUEUED


@pytest.mark.parametrize("query", ["?wait=0", "?wait=61", "?wait=soon"])
def test_a_bad_wait_is_a_400_naming_it(front_door_url, services, tenant_key, query):
    body = {"service": "embedding", "input": {"texts": ["x"]}}
    answer = _post(front_door_url, tenant_key, body, query)
    assert answer.status_code == 400
    assert list(answer.json()["error"]["fields"]) == ["wait"]
    assert not Job.objects.exists()


def test_a_list_cannot_wait(front_door_url, services, tenant_key):
    body = [{"service": "embedding", "input": {"texts": ["x"]}}]
    answer = _post(front_door_url, tenant_key, body)
    assert answer.status_code == 400
    assert list(answer.json()["error"]["fields"]) == ["wait"]


def test_the_django_test_client_waits_too(gpu_worker, api, services):
    answer = api.post(
        "/api/v1/jobs?wait=10",
        {"service": "embedding", "priority": "realtime", "input": {"texts": ["hi"]}},
        format="json",
    )
    assert answer.status_code == 200
    assert answer.json()["status"] == "succeeded"


def test_a_202_after_a_wait_is_sent_once_the_job_is_on_disk(api, unserved, monkeypatch):
    """A waiting POST commits without waiting for the WAL flush (its caller answers with the
    outcome); when it answers 202 instead, the job it names is made durable first."""
    from inference.api import views
    from inference.intake import row_writer

    flushed: list[bool] = []
    monkeypatch.setattr(
        views, "wait_until_flushed", lambda: flushed.append(row_writer.wait_until_flushed())
    )
    answer = api.post(
        "/api/v1/jobs?wait=0.2", {"service": unserved, "input": {"texts": ["x"]}}, format="json"
    )
    assert answer.status_code == 202
    assert flushed == [True]
    assert Job.objects.get(pk=answer.json()["id"]).status == JobStatus.QUEUED
