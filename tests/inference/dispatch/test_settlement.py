"""Settling attempts (inference.dispatch.settlement) on real Postgres and Redis: what the GPU
worker's store thread and the I/O worker do with the outcomes of the jobs they claimed."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from inference.dispatch.settlement import Attempt, local_attempts, settle_attempts
from inference.jobs.transitions import Outcome
from inference.models import Job, JobStatus
from renq_site.shared_redis import shared_redis
from routing.backends.base import BackendError
from routing.breaker import CircuitBreaker
from routing.models import AttemptOutcome, JobAttempt, JobRoute
from routing.router import forget_routes, route_entries

pytestmark = pytest.mark.django_db


@pytest.fixture
def claimed(make_tenant, make_service):
    """Claim `n` new embedding jobs, the first `routed` of them routed to `backend`."""
    service = make_service("embedding")
    tenant, _ = make_tenant()

    def claim(n: int, backend=None, routed: int = 0):
        jobs = [
            Job.objects.create(tenant=tenant, service=service, tier="api", input={"texts": ["x"]})
            for _ in range(n)
        ]
        for job in jobs[:routed]:
            JobRoute.objects.create(job=job, backend=backend, reason="test")
        return Job.objects.claim([str(job.pk) for job in jobs], worker="test-worker")

    return claim


def breaker_failures(backend) -> int:
    return int(shared_redis().hget(CircuitBreaker.key(backend.pk), "failures") or 0)


def test_a_local_pass_records_its_routed_attempts_and_stores_every_outcome(claimed, make_backend):
    local = make_backend("local-embedding", kind="local")
    claim = claimed(2, local, routed=1)
    routed, unrouted = claim.jobs
    usage = {"embeddings": [[0.0]], "usage": {"completion_tokens": 5}}
    outcomes = [
        Outcome(job=routed, result=usage, inference_ms=3.0, batch_size=2, tokens=7),
        Outcome(job=unrouted, result={"embeddings": [[1.0]]}, inference_ms=3.0, batch_size=2),
    ]

    stored = settle_attempts(
        claim.token,
        local_attempts(outcomes, claim.route_backend_ids),
        all_failed_trips_breaker=True,
    )

    # Each stored outcome names the backend that produced it (what its waiter is told).
    assert [(o.job.pk, o.backend) for o in stored] == [
        (routed.pk, "local-embedding"),
        (unrouted.pk, None),
    ]
    attempt = JobAttempt.objects.get()
    assert (attempt.job_id, attempt.backend, attempt.outcome) == (
        routed.pk,
        local,
        AttemptOutcome.SUCCEEDED,
    )
    assert (attempt.input_tokens, attempt.output_tokens, attempt.worker) == (7, 5, "test-worker")
    jobs = {job.pk: job for job in Job.objects.filter(pk__in=[routed.pk, unrouted.pk])}
    assert {job.status for job in jobs.values()} == {JobStatus.SUCCEEDED}
    # The attempt row first: whoever sees the job succeeded also sees how.
    assert attempt.finished_at <= jobs[routed.pk].finished_at


def test_a_routed_pass_is_stored_without_reading_its_backend_again(
    claimed, make_backend, make_route
):
    # The worker has its service's route cached; the store thread does not ask for the
    # backend a round trip at a time, and the attempt still names it.
    local = make_backend("local-embedding", kind="local")
    claim = claimed(1, local, routed=1)
    make_route(claim.jobs[0].service, (local, 0))
    forget_routes()
    route_entries(claim.jobs[0].service_id)  # as the worker's claim path has it cached
    outcome = Outcome(job=claim.jobs[0], result={"embeddings": [[0.0]]}, batch_size=1, tokens=3)

    with CaptureQueriesContext(connection) as queries:
        stored = settle_attempts(claim.token, local_attempts([outcome], claim.route_backend_ids))

    assert [o.backend for o in stored] == ["local-embedding"]
    assert JobAttempt.objects.get().backend == local
    assert not [q for q in queries if 'FROM "routing_backend"' in q["sql"]]


def test_a_local_pass_that_failed_every_job_counts_against_the_backend_and_one_bad_input_not(
    claimed, make_backend
):
    local = make_backend("local-embedding", kind="local")
    mixed = claimed(2, local, routed=2)
    ok, bad = mixed.jobs
    settle_attempts(
        mixed.token,
        local_attempts(
            [Outcome(job=ok, result={"embeddings": [[0.0]]}), Outcome(job=bad, error="boom")],
            mixed.route_backend_ids,
        ),
        all_failed_trips_breaker=True,
    )
    assert breaker_failures(local) == 0
    bad.refresh_from_db()
    # Its cascade has no other backend: it fails with every attempt's reason.
    assert bad.status == JobStatus.FAILED
    assert bad.error.startswith("every backend failed (1)") and "boom" in bad.error

    alone = claimed(1, local, routed=1)
    settle_attempts(
        alone.token,
        local_attempts([Outcome(job=alone.jobs[0], error="cuda gone")], alone.route_backend_ids),
        all_failed_trips_breaker=True,
    )
    assert breaker_failures(local) == 1
    assert JobAttempt.objects.get(job=alone.jobs[0]).outcome == AttemptOutcome.FAILED


def test_a_cloud_attempt_records_its_status_code_and_leaves_the_breaker_to_its_call(
    claimed, make_backend
):
    cloud = make_backend("free")
    claim = claimed(1, cloud, routed=1)
    (job,) = claim.jobs
    failure = BackendError("free: HTTP 500", status_code=500)
    attempt = Attempt(
        Outcome(job=job, error=failure.message),
        backend=cloud,
        failure=failure,
        status_code=500,
        worker="io-worker",
    )

    settle_attempts(claim.token, [attempt])

    row = JobAttempt.objects.get(job=job)
    assert (row.outcome, row.status_code, row.error, row.worker) == (
        AttemptOutcome.FAILED,
        500,
        "free: HTTP 500",
        "io-worker",
    )
    assert breaker_failures(cloud) == 0  # routing.calls counted it, not the settlement
    job.refresh_from_db()
    assert job.status == JobStatus.FAILED and "HTTP 500" in job.error
