"""Group commit: submissions made at the same time by one process's threads share a commit and
a publish, and each still gets the answer it would have got alone."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from inference.dispatch.broker import ready_message_counts
from inference.dispatch.queues import service_queues, tier_queue
from inference.intake import row_writer, submission
from inference.intake.admission import AdmissionRefused
from inference.intake.submission import submit_job
from inference.models import Job
from tests.conftest import purge_test_queues

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def first_commit_held(monkeypatch):
    """Once `waiting` is set, the next commit waits until that many more submissions queue
    behind it, so they commit together next (as they would under load). Records each execute:
    its number of statements, its error."""
    group_commit = submission._group_commit
    execute = group_commit._execute
    held = {"waiting": 0, "first": True, "entered": threading.Event()}
    calls: list[tuple[int, BaseException | None]] = []

    def held_execute(statements):
        if held["first"] and held["waiting"]:
            held["first"] = False
            held["entered"].set()
            deadline = time.monotonic() + 10
            while len(group_commit._waiting) < held["waiting"] and time.monotonic() < deadline:
                time.sleep(0.005)
        try:
            execute(statements)
        except BaseException as exc:
            calls.append((len(statements), exc))
            raise
        calls.append((len(statements), None))

    monkeypatch.setattr(group_commit, "_execute", held_execute)
    held["calls"] = calls
    return held


def _submit_concurrently(
    tenant, services: list[str], first_commit_held: dict, waits: list[bool] | None = None
) -> list:
    """One thread per job: the first's commit is held while the others submit (`waits`: whether
    each one's caller waits for its outcome). Each answer: the job or the exception."""
    answers: list = [None] * len(services)

    def submit(i: int) -> None:
        try:
            answers[i] = submit_job(
                tenant=tenant,
                service_name=services[i],
                payload={"texts": [f"text {i} {waits}"]},
                caller_waits=bool(waits and waits[i]),
            )
        except Exception as exc:  # noqa: BLE001 - the answer under test
            answers[i] = exc
        finally:
            connection.close()

    threads = [threading.Thread(target=submit, args=(i,)) for i in range(len(services))]
    threads[0].start()
    assert first_commit_held["entered"].wait(timeout=30)
    for thread in threads[1:]:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    return answers


def test_submissions_arriving_together_commit_and_publish_together(
    make_tenant, make_service, first_commit_held
):
    make_service("noop", name="grouped")  # no worker: messages stay in their queue
    purge_test_queues(service_queues("grouped"))
    tenant, _ = make_tenant()
    first_commit_held["waiting"] = 3
    groups_before = submission._group_commit.groups_committed

    answers = _submit_concurrently(tenant, ["grouped"] * 4, first_commit_held)

    assert all(isinstance(job, Job) for job in answers), answers
    assert Job.objects.filter(pk__in=[j.pk for j in answers], status="queued").count() == 4
    # The first alone; the three that waited for it in one commit and one message.
    assert submission._group_commit.groups_committed == groups_before + 1
    assert sorted(first_commit_held["calls"]) == [(3, None), (9, None)]
    queue = tier_queue("grouped", answers[0].tier)
    assert ready_message_counts([queue]) == {queue: 2}


def test_a_refused_member_leaves_the_others_of_its_group_accepted(
    make_tenant, make_service, first_commit_held
):
    make_service("noop", name="roomy")
    make_service("noop", name="full", max_queue_size=1)
    purge_test_queues(service_queues("roomy") + service_queues("full"))
    tenant, _ = make_tenant()
    submit_job(tenant=tenant, service_name="full", payload={"texts": ["the one that fits"]})
    first_commit_held["waiting"] = 3

    answers = _submit_concurrently(tenant, ["roomy", "roomy", "full", "roomy"], first_commit_held)

    refused = answers[2]
    assert isinstance(refused, AdmissionRefused), refused
    assert (refused.status_code, refused.quota) == (503, "max_queue_size")
    accepted = [answers[i] for i in (0, 1, 3)]
    assert all(isinstance(job, Job) for job in accepted), answers
    assert Job.objects.filter(service__name="roomy").count() == 3
    assert Job.objects.filter(service__name="full").count() == 1
    # The group's commit failed whole; then each member ran alone.
    errors = [exc for _, exc in first_commit_held["calls"] if exc is not None]
    assert len(errors) == 2  # the group's, and the full service's own
    queue = tier_queue("roomy", accepted[0].tier)
    assert sum(ready_message_counts([queue]).values()) == 3



@pytest.fixture
def reply_lost(monkeypatch):
    """Every commit goes through, then its connection breaks before the answer is read (a
    server stopped just after COMMIT): the submitter cannot know that it committed."""
    from inference.intake.row_writer import OutcomeUnknown

    group_commit = submission._group_commit
    execute = group_commit._execute

    def committed_then_lost(statements):
        execute(statements)
        raise OutcomeUnknown("server closed the connection unexpectedly")

    monkeypatch.setattr(group_commit, "_execute", committed_then_lost)


def test_a_submission_whose_commit_reply_was_lost_is_refused_yet_dispatched(
    make_tenant, make_service, reply_lost
):
    # Its job may be stored (here it is): it gets its message now, not a minute later from
    # the lost-message sweep. The client hears 503 and may retry.
    from inference.intake.row_writer import OutcomeUnknown

    make_service("noop", name="reply-lost")
    purge_test_queues(service_queues("reply-lost"))
    tenant, _ = make_tenant()

    with pytest.raises(OutcomeUnknown):
        submit_job(tenant=tenant, service_name="reply-lost", payload={"texts": ["x"]})

    job = Job.objects.get(service__name="reply-lost")
    queue = tier_queue("reply-lost", job.tier)
    assert ready_message_counts([queue]) == {queue: 1}
    purge_test_queues(service_queues("reply-lost"))


def test_members_of_a_group_whose_commit_reply_was_lost_are_not_run_again_alone(
    make_tenant, make_service, first_commit_held, reply_lost
):
    # Run alone after a group that did commit, a member would store its job a second time.
    from inference.intake.row_writer import OutcomeUnknown

    make_service("noop", name="reply-lost-group")
    purge_test_queues(service_queues("reply-lost-group"))
    tenant, _ = make_tenant()
    first_commit_held["waiting"] = 3
    answers = _submit_concurrently(tenant, ["reply-lost-group"] * 4, first_commit_held)

    assert all(isinstance(answer, OutcomeUnknown) for answer in answers), answers
    jobs = Job.objects.filter(service__name="reply-lost-group")
    assert jobs.count() == 4
    queue = tier_queue("reply-lost-group", jobs[0].tier)
    assert ready_message_counts([queue]) == {queue: 4}
    purge_test_queues(service_queues("reply-lost-group"))


def _executed_sql(monkeypatch) -> list[str]:
    """The query string of each commit the process's group commit runs."""
    group_commit = submission._group_commit
    execute = group_commit._execute
    executed: list[str] = []

    def recording(statements):
        executed.append(";\n".join(sql for sql, _ in statements))
        execute(statements)

    monkeypatch.setattr(group_commit, "_execute", recording)
    return executed


def test_a_waiting_callers_commit_skips_the_wal_flush_and_is_flushed_before_it_answers(
    make_tenant, make_service, monkeypatch
):
    """A submission whose caller answers with the job's outcome (a synchronous front door)
    commits without waiting for the disk, as a claim does; any other waits. Both are stored
    and visible at once, and wait_until_flushed returns once the first is on disk."""
    make_service("noop", name="unflushed")
    purge_test_queues(service_queues("unflushed"))
    tenant, _ = make_tenant()
    executed = _executed_sql(monkeypatch)

    waited = submit_job(tenant=tenant, service_name="unflushed", payload={"texts": ["a"]},
                        caller_waits=True)  # fmt: skip
    accepted = submit_job(tenant=tenant, service_name="unflushed", payload={"texts": ["b"]})

    assert executed[0].startswith("SET LOCAL synchronous_commit TO off;")
    assert "synchronous_commit" not in executed[1]
    assert Job.objects.filter(pk__in=[waited.pk, accepted.pk], status="queued").count() == 2
    assert row_writer.wait_until_flushed()
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn()")
        assert cursor.fetchone()[0]
    purge_test_queues(service_queues("unflushed"))


def test_a_group_skips_the_wal_flush_only_when_every_caller_waits(
    make_tenant, make_service, first_commit_held
):
    make_service("noop", name="mixed-waits")
    purge_test_queues(service_queues("mixed-waits"))
    tenant, _ = make_tenant()

    def submit_group(waits: list[bool]) -> list:
        first_commit_held.update(first=True, waiting=len(waits) - 1)
        first_commit_held["entered"].clear()
        return _submit_concurrently(tenant, ["mixed-waits"] * len(waits), first_commit_held, waits)

    # Each commit's statement count: 3 per submission alone, 9 for a group of three, one
    # more when the commit is told not to wait for the WAL flush.
    answers = submit_group([True, True, False, True])
    assert sorted(first_commit_held["calls"]) == [(4, None), (9, None)]
    first_commit_held["calls"].clear()
    answers += submit_group([False, True, True, True])
    assert sorted(first_commit_held["calls"]) == [(3, None), (10, None)]
    assert Job.objects.filter(pk__in=[j.pk for j in answers], status="queued").count() == 8
    purge_test_queues(service_queues("mixed-waits"))
