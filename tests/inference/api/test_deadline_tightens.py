"""deadline_ms tightens a job's deadline and never loosens it: an interactive job's deadline is
the service's total_timeout, or the request's own when that is sooner."""

from __future__ import annotations

import pytest

from inference.intake.submission import MAX_DEADLINE_MS
from inference.models import Job

pytestmark = pytest.mark.django_db


def _deadline_s(api, priority: str, deadline_ms: int) -> float:
    response = api.post(
        "/api/v1/jobs",
        {
            "service": "embedding",
            "priority": priority,
            "deadline_ms": deadline_ms,
            "input": {"texts": ["x"]},
        },
        format="json",
    )
    assert response.status_code == 202, response.content
    job = Job.objects.get(pk=response.json()["id"])
    return (job.deadline_at - job.created_at).total_seconds()


def test_an_interactive_jobs_deadline_is_never_past_total_timeout(api, make_service):
    make_service("embedding", total_timeout=2)
    assert _deadline_s(api, "realtime", MAX_DEADLINE_MS) == 2  # a week asked: 2 s kept
    assert _deadline_s(api, "api", 60_000) == 2
    assert _deadline_s(api, "realtime", 500) == 0.5  # sooner: the request's own


def test_batch_work_keeps_the_deadline_it_asked_for(api, make_service):
    # total_timeout is the promise of the interactive tiers; batch work has none to tighten.
    make_service("embedding", total_timeout=2)
    assert _deadline_s(api, "batch", 60_000) == 60
    assert _deadline_s(api, "offline", 500) == 0.5
