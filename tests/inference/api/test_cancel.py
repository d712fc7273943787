"""Cancellation as a client reads it: POST /api/v1/jobs/<id>/cancel answers with the job, as
OpenAI's batch cancel does; DELETE is kept and does the same (the job stays readable), and the
OpenAPI schema says so."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from inference.models import AuditEvent, Job, JobStatus

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(api, make_service) -> str:
    make_service("embedding")  # no worker: the job stays queued
    response = api.post(
        "/api/v1/jobs", {"service": "embedding", "input": {"texts": ["a"]}}, format="json"
    )
    assert response.status_code == 202, response.content
    return response.json()["id"]


def test_post_cancel_answers_with_the_cancelled_job_then_409(api, queued):
    response = api.post(f"/api/v1/jobs/{queued}/cancel")
    assert response.status_code == 200, response.content
    assert response.json()["id"] == queued and response.json()["status"] == "cancelled"
    assert Job.objects.get(pk=queued).status == JobStatus.CANCELLED
    assert AuditEvent.objects.filter(job_id=queued, kind="cancelled").count() == 1
    # Cancelled, not deleted: it can still be read.
    assert api.get(f"/api/v1/jobs/{queued}").json()["status"] == "cancelled"
    again = api.post(f"/api/v1/jobs/{queued}/cancel")
    assert again.status_code == 409
    assert again.json()["error"]["code"] == "not_cancellable"


def test_delete_is_the_same_cancel(api, queued):
    response = api.delete(f"/api/v1/jobs/{queued}")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "cancelled"
    assert api.get(f"/api/v1/jobs/{queued}").status_code == 200
    assert api.post(f"/api/v1/jobs/{queued}/cancel").status_code == 409


def test_another_tenants_job_cannot_be_cancelled(api, queued, make_tenant):
    _, other_key = make_tenant(name="other")
    other = APIClient()
    other.credentials(HTTP_AUTHORIZATION=f"Bearer {other_key}")
    assert other.post(f"/api/v1/jobs/{queued}/cancel").status_code == 404
    assert Job.objects.get(pk=queued).status == JobStatus.QUEUED


def test_the_schema_documents_post_cancel_and_delete_as_cancel(client):
    schema = client.get("/api/schema/?format=json").json()
    cancel = schema["paths"]["/api/v1/jobs/{job_id}/cancel"]["post"]
    assert cancel["operationId"] == "jobs_cancel"
    assert set(cancel["responses"]) >= {"200", "404", "409"}
    assert cancel["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Job"
    }
    delete = schema["paths"]["/api/v1/jobs/{job_id}"]["delete"]
    assert "Cancel a job" in delete["summary"]
    assert "not deleted" in delete["description"]
