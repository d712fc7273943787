"""The state machine changes rows and sends signals; counting and waking are receivers'."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from inference.jobs import signals
from inference.jobs.transitions import Outcome
from inference.models import Job, JobStatus

JOBS_WING = Path(__file__).resolve().parents[3] / "inference" / "jobs"


def _job(tenant, service) -> Job:
    return Job.objects.create(tenant=tenant, service=service, tier="batch", input={"texts": ["x"]})


class Heard:
    def __init__(self, signal):
        self.calls: list[dict] = []
        self.signal = signal

    def __call__(self, sender, **kwargs):
        self.calls.append(kwargs)

    def __enter__(self):
        self.signal.connect(self, weak=False)
        return self

    def __exit__(self, *exc):
        self.signal.disconnect(self)


def test_the_jobs_wing_imports_nothing_that_records_or_wakes():
    imported = set()
    for path in JOBS_WING.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported.update(alias.name for alias in node.names)
    assert not {m for m in imported if m.startswith(("inference.metrics", "inference.delivery"))}
    assert "redis" not in imported and "prometheus_client" not in imported


@pytest.mark.django_db
def test_stored_outcomes_are_announced_and_waiters_hear_only_after_commit(
    make_tenant, make_service, django_capture_on_commit_callbacks
):
    tenant, _ = make_tenant()
    service = make_service("embedding")
    job = _job(tenant, service)
    claim = Job.objects.claim([job.pk], worker="w")
    with (
        Heard(signals.outcomes_stored) as stored,
        Heard(signals.jobs_finished) as finished,
        django_capture_on_commit_callbacks(execute=True) as callbacks,
    ):
        Job.objects.store_outcomes(claim.token, [Outcome(job=claim.jobs[0], result={"ok": 1})])
        assert [o.job.pk for o in stored.calls[0]["outcomes"]] == [job.pk]
        assert finished.calls == []  # not before the row is committed
    assert len(callbacks) == 1
    [call] = finished.calls
    assert call["job_ids"] == [job.pk]
    # The success was written under the claim: it is announced with its outcome.
    assert [(o.job.pk, o.result) for o in call["stored"]] == [(job.pk, {"ok": 1})]


@pytest.mark.django_db
def test_an_outcome_stored_under_a_lost_claim_is_not_announced_as_stored(
    make_tenant, make_service, django_capture_on_commit_callbacks
):
    tenant, _ = make_tenant()
    service = make_service("embedding")
    job = _job(tenant, service)
    first = Job.objects.claim([job.pk], worker="w1")
    Job.objects.filter(pk=job.pk).requeue()
    Job.objects.claim([job.pk], worker="w2")  # the job moved on: w1's late outcome is dropped
    with (
        Heard(signals.jobs_finished) as finished,
        django_capture_on_commit_callbacks(execute=True),
    ):
        written = Job.objects.store_outcomes(
            first.token, [Outcome(job=first.jobs[0], result={"ok": 1})]
        )
    assert written == 0
    assert finished.calls[0]["stored"] == []


@pytest.mark.django_db
def test_a_filtered_move_is_announced_before_its_rows_change(make_tenant, make_service):
    tenant, _ = make_tenant()
    service = make_service("embedding")
    job = _job(tenant, service)
    statuses = []

    def count(sender, *, queryset, from_status, status, reason, **_):
        statuses.append((queryset.get().status, from_status, status, reason))

    signals.jobs_leaving.connect(count, weak=False)
    try:
        assert Job.objects.filter(pk=job.pk).cancel() == 1
    finally:
        signals.jobs_leaving.disconnect(count)
    assert statuses == [(JobStatus.QUEUED, JobStatus.QUEUED, JobStatus.CANCELLED, "by_request")]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "move",
    [
        lambda jobs: jobs.cancel(),
        lambda jobs: jobs.expire("too late"),
    ],
    ids=["cancel", "expire"],
)
def test_a_filtered_move_to_a_final_status_names_the_jobs_it_moved_once_committed(
    make_tenant, make_service, django_capture_on_commit_callbacks, move
):
    tenant, _ = make_tenant()
    service = make_service("embedding")
    moved, other = _job(tenant, service), _job(tenant, service)
    with (
        Heard(signals.jobs_finished) as finished,
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert move(Job.objects.filter(pk=moved.pk)) == 1
    assert [call["job_ids"] for call in finished.calls] == [[moved.pk]]
    assert Job.objects.get(pk=other.pk).status == JobStatus.QUEUED

    with Heard(signals.jobs_finished) as again:  # nothing left to move: nothing announced
        assert move(Job.objects.filter(pk=moved.pk)) == 0
    assert again.calls == []


@pytest.mark.django_db
def test_a_bulk_parents_end_names_it_once_committed(
    make_tenant, make_service, django_capture_on_commit_callbacks
):
    tenant, _ = make_tenant()
    service = make_service("embedding")
    parent = Job.objects.create(
        tenant=tenant, service=service, tier="batch", input={"texts": ["x"]}, is_bulk=True
    )
    Job.objects.filter(pk=parent.pk).update(status=JobStatus.RUNNING)
    with (
        Heard(signals.jobs_finished) as finished,
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert Job.objects.filter(pk=parent.pk).finish_bulk({"embeddings": [[1.0]]}) == 1
    assert [call["job_ids"] for call in finished.calls] == [[parent.pk]]
