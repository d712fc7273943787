"""The job state machine: every status write is in inference/jobs/transitions.py, and each move
is one of its table's legal transitions."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest
from django.conf import settings

from inference.jobs.transitions import TRANSITIONS, Outcome
from inference.models import Job, JobStatus

ROOT = Path(__file__).resolve().parents[3]
STATUS_WRITE = re.compile(r"\.update\([^)]*\bstatus\s*=", re.S)


def test_no_status_write_outside_the_state_machine():
    offenders = []
    for package in ("inference", "routing"):
        for path in (ROOT / package).rglob("*.py"):
            if "migrations" in path.parts or path.name == "transitions.py":
                continue
            if STATUS_WRITE.search(path.read_text()):
                offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def _job(tenant, service, **fields) -> Job:
    return Job.objects.create(
        tenant=tenant, service=service, tier="batch", input={"texts": ["x"]}, **fields
    )


@pytest.mark.django_db
def test_each_move_is_legal_and_guarded_by_the_status_it_leaves(make_tenant, make_service):
    tenant, _ = make_tenant()
    service = make_service("embedding")
    moves = []

    def moved(job, before):
        job.refresh_from_db()
        if job.status != before:
            moves.append((before, job.status))
        return job.status

    job = _job(tenant, service)
    claim = Job.objects.claim([job.pk], worker="w")
    assert moved(job, JobStatus.QUEUED) == JobStatus.RUNNING
    # A second claim of a running job (a duplicate message) takes nothing.
    assert Job.objects.claim([job.pk], worker="w2").jobs == []
    assert Job.objects.filter(pk=job.pk, claim_token=claim.token).requeue() == 1
    assert moved(job, JobStatus.RUNNING) == JobStatus.QUEUED
    assert Job.objects.filter(pk=job.pk).cancel() == 1
    assert moved(job, JobStatus.QUEUED) == JobStatus.CANCELLED
    # Nothing leaves a final state: cancel, expire, requeue and fail find no row.
    qs = Job.objects.filter(pk=job.pk)
    assert (qs.cancel(), qs.expire("late"), qs.requeue(), qs.fail("x")) == (0, 0, 0, 0)

    other = _job(tenant, service)
    claim = Job.objects.claim([other.pk], worker="w")
    # Only the holder of the current token may store the outcome.
    assert (
        Job.objects.store_outcomes(claim.token.__class__(int=0), [Outcome(job=other, result={})])
        == 0
    )
    assert Job.objects.store_outcomes(claim.token, [Outcome(job=other, result={"ok": 1})]) == 1
    assert moved(other, JobStatus.RUNNING) == JobStatus.SUCCEEDED

    assert set(moves) <= set(TRANSITIONS)
    assert len(moves) == 4


@pytest.mark.django_db(transaction=True)
def test_a_claim_is_one_statement_and_returns_whole_jobs(make_tenant, make_service):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from routing.models import Backend, JobRoute

    # The worker claims between forward passes: the claimed jobs come back with their input,
    # service, tenant and route's backend (storing a routed job's outcome records its
    # attempt there) from the UPDATE itself, not from further queries per job.
    tenant, _ = make_tenant("claimer")
    service = make_service("embedding", name="claim-rows")
    jobs = [
        Job.objects.create(tenant=tenant, service=service, tier="batch", input={"texts": [f"t{i}"]})
        for i in range(3)
    ]
    local = Backend.objects.create(name="claim-rows-local", kind="local")
    JobRoute.objects.create(job=jobs[1], backend=local, reason="test")
    with CaptureQueriesContext(connection) as queries:
        claim = Job.objects.claim([j.pk for j in reversed(jobs)], worker="w1")
        seen = [
            (str(job.pk), job.input["texts"], job.service.name, job.tenant.name, job.status)
            for job in claim.jobs
        ]
    # (A session's first claim prepares the statement first, once.)
    statements = [q["sql"] for q in queries if not q["sql"].startswith("PREPARE")]
    assert len(statements) == 1, statements
    assert seen == [
        (str(j.pk), j.input["texts"], "claim-rows", "claimer", JobStatus.RUNNING)
        for j in reversed(jobs)
    ]
    assert claim.jobs[0].claim_token == claim.token and claim.jobs[0].worker == "w1"
    assert claim.route_backend_ids == {jobs[1].pk: local.pk}


@pytest.mark.django_db
def test_a_batch_of_successes_is_stored_with_one_completion_each_and_only_once(
    make_tenant, make_service
):
    from inference.models import AuditEvent

    # After every forward pass the outcomes and their "completed" audit rows are written by
    # one statement; a second store under the same claim (a redelivered message) changes
    # nothing and records no second completion.
    tenant, _ = make_tenant("storer")
    service = make_service("noop", name="store-rows")
    jobs = [_job(tenant, service) for _ in range(3)]
    claim = Job.objects.claim([j.pk for j in jobs], worker="w1")
    outcomes = [Outcome(job=j, result={"ok": True}, inference_ms=1.0) for j in claim.jobs]
    assert Job.objects.store_outcomes(claim.token, outcomes) == 3
    assert Job.objects.store_outcomes(claim.token, outcomes) == 0
    stored = Job.objects.filter(pk__in=[j.pk for j in jobs])
    assert {job.status for job in stored} == {JobStatus.SUCCEEDED}
    completions = AuditEvent.objects.filter(job_id__in=[j.pk for j in jobs], kind="completed")
    assert sorted(str(e.job_id) for e in completions) == sorted(str(j.pk) for j in jobs)
    assert {e.actor for e in completions} == {"w1"}


@pytest.mark.django_db
def test_a_mixed_batch_stored_twice_records_one_completion_per_job(make_tenant, make_service):
    from inference.models import AuditEvent

    # Successes and a failure in one batch go through the transaction path; a redelivered
    # message storing the same outcomes again must not record a second completion either.
    tenant, _ = make_tenant("mixed-storer")
    service = make_service("noop", name="store-mixed")
    jobs = [_job(tenant, service) for _ in range(3)]
    claim = Job.objects.claim([j.pk for j in jobs], worker="w1")
    ok, ok2, bad = claim.jobs
    outcomes = [
        Outcome(job=ok, result={"ok": True}, inference_ms=1.0),
        Outcome(job=ok2, result={"ok": True}, inference_ms=1.0),
        Outcome(job=bad, error="the model raised"),
    ]
    assert Job.objects.store_outcomes(claim.token, outcomes) == 3
    assert Job.objects.store_outcomes(claim.token, outcomes) == 0
    statuses = dict(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("pk", "status"))
    assert statuses == {
        ok.pk: JobStatus.SUCCEEDED,
        ok2.pk: JobStatus.SUCCEEDED,
        bad.pk: JobStatus.FAILED,
    }
    completions = AuditEvent.objects.filter(job_id__in=[j.pk for j in jobs], kind="completed")
    assert sorted(str(e.job_id) for e in completions) == sorted(str(j.pk) for j in jobs)


@pytest.mark.django_db(transaction=True)
def test_a_claim_of_its_own_commits_asynchronously_and_the_session_stays_synchronous(
    make_tenant, make_service
):
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    # The claim does not wait for the WAL flush (a lost claim is recovered, see the next
    # test), but the setting ends with the claim's own transaction: the session's other
    # writes, and a claim inside a caller's transaction, stay synchronous.
    tenant, _ = make_tenant()
    service = make_service("noop", name="claim-async")
    alone, inside = _job(tenant, service), _job(tenant, service)

    def setting(name: str = "synchronous_commit") -> str:
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting(%s)", [name])
            return cursor.fetchone()[0]

    with CaptureQueriesContext(connection) as queries:
        assert len(Job.objects.claim([alone.pk], worker="w").jobs) == 1
    (claim_sql,) = [q["sql"] for q in queries if "EXECUTE renq_claim" in q["sql"]]
    assert claim_sql.startswith("SET LOCAL synchronous_commit TO off;")
    assert setting() == "on" and setting("enable_seqscan") == "on"

    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        assert len(Job.objects.claim([inside.pk], worker="w").jobs) == 1
        assert setting() == "on" and setting("enable_seqscan") == "on"
    assert not any("SET LOCAL synchronous_commit" in q["sql"] for q in queries)


@pytest.mark.django_db(transaction=True)
def test_only_a_result_a_rerun_would_give_again_skips_the_wal_flush(make_tenant, make_service):
    from django.db import connection, transaction
    from django.test.utils import CaptureQueriesContext

    # A store a crash undid is run again (tests/inference/workers/test_leases.py): the same
    # vectors for an embedding, another text for a sampled generation whose client may
    # already hold the first one. So a generation's store waits for the flush, as does one
    # inside a caller's transaction.
    tenant, _ = make_tenant()
    reproducible = make_service("noop", name="store-async")
    sampled = make_service("llm", name="store-sync")
    vectors, text = _job(tenant, reproducible), _job(tenant, sampled)
    inside = _job(tenant, reproducible)

    def stored(job: Job, *, atomic: bool = False) -> str:
        claim = Job.objects.claim([job.pk], worker="w")
        with transaction.atomic() if atomic else contextlib.nullcontext():
            outcome = Outcome(job=claim.jobs[0], result={"ok": 1}, inference_ms=1.0)
            with CaptureQueriesContext(connection) as queries:
                assert Job.objects.store_outcomes(claim.token, [outcome]) == 1
        (sql,) = [q["sql"] for q in queries if "EXECUTE renq_store_successes" in q["sql"]]
        return sql

    assert stored(vectors).startswith("SET LOCAL synchronous_commit TO off;")
    assert "synchronous_commit" not in stored(text)
    assert "synchronous_commit" not in stored(inside, atomic=True)
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_claim_a_postgres_crash_undid_still_runs_its_job(make_tenant, make_service):
    from datetime import timedelta

    from django.conf import settings
    from django.utils import timezone

    from inference.dispatch.publishing import publish
    from inference.dispatch.queues import service_queues
    from inference.workers.sweeper import republish_lost_messages
    from tests.conftest import purge_test_queues

    tenant, _ = make_tenant()
    service = make_service("noop", name="claim-undone")
    job = _job(tenant, service)
    assert publish(job)
    claim = Job.objects.claim([job.pk], worker="w")
    # What a crash before the WAL flush leaves: the claim never happened...
    Job.objects.filter(pk=job.pk).update(
        status=JobStatus.QUEUED, claim_token=None, claimed_at=None, attempts=0, worker=""
    )
    # ...while the worker ran the job, stored under the lost token and acked its message.
    outcome = Outcome(job=claim.jobs[0], result={"ok": True}, inference_ms=1.0)
    assert Job.objects.store_outcomes(claim.token, [outcome]) == 0
    purge_test_queues(service_queues(service.name))
    job.refresh_from_db()
    assert job.status == JobStatus.QUEUED

    later = timezone.now() + timedelta(seconds=settings.RENQ_LOST_MESSAGE_AFTER_S + 1)
    assert republish_lost_messages(now=later) == 1
    assert len(Job.objects.claim([job.pk], worker="w2").jobs) == 1
    purge_test_queues(service_queues(service.name))


@pytest.mark.django_db
def test_a_job_redelivered_to_the_process_that_held_it_is_not_counted_as_lost(
    make_tenant, make_service
):
    # A broker connection that drops and comes back redelivers the messages of jobs their
    # process still runs: taking them over again is no lost worker, however often it happens.
    tenant, _ = make_tenant("redelivered")
    service = make_service("noop", name="redelivered")
    job = _job(tenant, service)
    Job.objects.claim([job.pk], worker="host:1")
    for _ in range(settings.RENQ_MAX_ATTEMPTS + 1):
        claim = Job.objects.claim([job.pk], redelivered_ids=[job.pk], worker="host:1")
        assert [j.pk for j in claim.jobs] == [job.pk] and not claim.dead_lettered
    assert Job.objects.get(pk=job.pk).attempts == 1

    # Another process taking it over means its holder was lost: counted, then poison.
    for attempts in range(2, settings.RENQ_MAX_ATTEMPTS + 1):
        Job.objects.claim([job.pk], redelivered_ids=[job.pk], worker=f"host:{attempts}")
        assert Job.objects.get(pk=job.pk).attempts == attempts
    claim = Job.objects.claim([job.pk], redelivered_ids=[job.pk], worker="host:99")
    assert claim.dead_lettered == [job.pk] and not claim.jobs
    assert Job.objects.get(pk=job.pk).status == JobStatus.FAILED


@pytest.mark.django_db(transaction=True)
def test_claim_and_store_are_planned_once_per_session(make_tenant, make_service):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    # A worker claims and stores between every two forward passes: PostgreSQL plans each
    # statement once per session, whatever the batch's size, and a new session (a reconnect
    # after a PostgreSQL restart) prepares them again.
    tenant, _ = make_tenant()
    service = make_service("noop", name="prepared")

    def run(jobs: list[Job]) -> list[str]:
        with CaptureQueriesContext(connection) as queries:
            claim = Job.objects.claim([j.pk for j in jobs], worker="w")
            outcomes = [Outcome(job=j, result={"n": 1}, inference_ms=1.0) for j in claim.jobs]
            assert Job.objects.store_outcomes(claim.token, outcomes) == len(jobs)
        sent = [q["sql"] for q in queries if "renq_" in q["sql"]]
        return ["PREPARE" if sql.startswith("PREPARE") else "EXECUTE" for sql in sent]

    connection.close()
    prepared_then_run = ["PREPARE", "EXECUTE", "PREPARE", "EXECUTE"]
    assert run([_job(tenant, service)]) == prepared_then_run
    assert run([_job(tenant, service) for _ in range(3)]) == ["EXECUTE", "EXECUTE"]
    connection.close()
    assert run([_job(tenant, service) for _ in range(2)]) == prepared_then_run
    assert Job.objects.filter(status=JobStatus.SUCCEEDED).count() == 6


@pytest.mark.django_db(transaction=True)
def test_claim_and_store_find_their_jobs_by_id_whatever_the_table_statistics(
    make_tenant, make_service
):
    from django.db import connection

    from inference.jobs.transitions import _BY_ID, _SUCCEED_AND_AUDIT, _claim_layout

    # A generic plan is kept once made. Made on a table just emptied (a new install, a
    # TRUNCATE), a sequential scan, or a status index full of dead entries, would then be read
    # by every claim and store however many jobs wait: the plan looks jobs up by id.
    tenant, _ = make_tenant()
    job = _job(tenant, make_service("noop", name="planned-by-id"))
    params = {
        "token": "00000000-0000-0000-0000-000000000001",
        "now": job.created_at,
        "lease_s": 30.0,
        "attempt": 1,
        "worker": "w",
        "ids": [str(job.pk)],
        "redelivered": [],
        "max_attempts": 3,
        "results": ["{}"],
        "vectors": [None],
        "started": [job.created_at],
        "inference_ms": [1.0],
        "batch_sizes": [1],
        "tokens": [1],
    }
    with connection.cursor() as cursor:
        for statement in (_claim_layout(Job)[0], _SUCCEED_AND_AUDIT):
            sql = statement.sql_for(cursor)
            cursor.execute(
                "BEGIN; SET LOCAL plan_cache_mode = force_generic_plan;"
                + _BY_ID
                + "EXPLAIN "
                + sql,
                params,
            )
            plan = "\n".join(row[0] for row in cursor.fetchall())
            cursor.execute("ROLLBACK")
            assert "inference_job_pkey" in plan, plan
            assert "Seq Scan on inference_job " not in plan, plan
