"""Every REST view names the query parameters it reads: any other is a 400 naming it, as an
unknown body field is, so a typo never answers as if it had not been asked."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from inference.models import Job

pytestmark = pytest.mark.django_db

JOB = {"service": "noop", "input": {"texts": ["x"]}}


@pytest.fixture
def noop(make_service):
    return make_service("noop")


@pytest.mark.parametrize(
    ("path", "typo"),
    [
        ("/api/v1/jobs?stauts=queued", "stauts"),
        ("/api/v1/jobs?status=queued&priority=batch", "priority"),
        ("/api/v1/queues?service=noop", "service"),
        ("/api/v1/services?active=1", "active"),
    ],
)
def test_a_read_with_an_unknown_query_parameter_is_a_400_naming_it(api, noop, path, typo):
    answer = api.get(path)
    assert answer.status_code == 400
    assert list(answer.json()["error"]["fields"]) == [typo]


def test_a_submission_with_an_unknown_query_parameter_is_refused_and_nothing_runs(api, noop):
    answer = api.post("/api/v1/jobs?wiat=5", JOB, format="json")
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert list(error["fields"]) == ["wiat"]
    assert "encoding_format, wait" in error["message"]  # what it could have meant
    assert not Job.objects.exists()


def test_the_known_ones_still_work_and_a_missing_key_is_still_a_401(api, noop):
    job = api.post("/api/v1/jobs", JOB, format="json").json()
    assert api.get("/api/v1/jobs?status=queued&service=noop&limit=5&offset=0").status_code == 200
    assert api.get(f"/api/v1/jobs/{job['id']}?encoding_format=base64").status_code == 200
    assert APIClient().get("/api/v1/jobs?stauts=queued").status_code == 401


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/api/v1/jobs:batchGet?id=00000000-0000-4000-8000-000000000000"),
        ("put", "/api/v1/jobs?status=queued"),
        ("post", "/api/v1/queues?service=noop"),
    ],
)
def test_a_method_a_view_does_not_answer_is_a_405_whatever_its_query(api, noop, method, path):
    assert getattr(api, method)(path).status_code == 405
