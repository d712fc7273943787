"""The job state machine: every status change of a job is a method here, and only here.

    queued ──claim──▶ running ──store_outcomes──▶ succeeded | failed
      │  ▲              │ │ └──claim (deadline passed)──▶ expired
      │  └──release / requeue (handed back unstarted; lease lapsed; handed to the next backend)
      │                 └──fail (poison: lost too often; cascade ended)──▶ failed
      ├──expire (nobody started it in time)──▶ expired
      └──cancel──▶ cancelled
    failed ──revive (a dead-lettered job, by an admin)──▶ queued

Every write is one conditional UPDATE that names the status it leaves, so two processes racing
for the same job cannot both win: a duplicate message finds the job no longer queued; a
*redelivered* message of a running job means the previous holder lost its channel (died, lost
the broker), so the claim is taken over with a new token and the old holder's late write
matches no row. The methods live on `JobQuerySet`, so callers filter first and transition
second: `Job.objects.filter(pk=…, claim_token=token).requeue()`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.db import connection, models, transaction
from django.db.models import Expression, F
from django.db.models.expressions import RawSQL
from django.utils import timezone
from psycopg2 import Binary

from inference.jobs import signals
from inference.jobs.kinds import kind_of
from inference.jobs.prepared import PreparedStatement
from inference.jobs.status import JobStatus
from inference.jobs.tiers import promises_latency
from inference.jobs.vectors import split_result
from routing.models import JobRoute

# A job row (inference.models.Job): the machine works on whatever model its query set is for,
# so it imports no model of its own.
JobRow = models.Model


# (from, to) → the method that makes the move. The table is the contract; tests check that
# every method only makes the moves listed for it.
TRANSITIONS: dict[tuple[str, str], str] = {
    (JobStatus.QUEUED, JobStatus.RUNNING): "claim",
    (JobStatus.RUNNING, JobStatus.RUNNING): "claim (takeover of a redelivered job)",
    (JobStatus.RUNNING, JobStatus.EXPIRED): "claim (waited past its deadline)",
    (JobStatus.RUNNING, JobStatus.SUCCEEDED): "store_outcomes / finish_bulk",
    (JobStatus.RUNNING, JobStatus.FAILED): "store_outcomes / fail",
    (JobStatus.RUNNING, JobStatus.QUEUED): "release / requeue",
    (JobStatus.QUEUED, JobStatus.EXPIRED): "expire",
    (JobStatus.QUEUED, JobStatus.CANCELLED): "cancel",
    (JobStatus.RUNNING, JobStatus.CANCELLED): "cancel_bulk (a bulk parent)",
    (JobStatus.FAILED, JobStatus.QUEUED): "revive (a dead-lettered job, by an admin)",
}

EXPIRED_IN_QUEUE = "waited longer than the service's queue_timeout before a worker was free"

# The claimed rows come back with their service, tenant and route's backend in the claim's
# own round trip: a worker claims between forward passes, and storing a routed job's outcome
# records its attempt on that backend, so asking later would put a round trip on every job.
# A redelivered job taken over by the process that held it (its reader channel dropped and
# came back) lost no worker: no attempt is counted. Prepared; its status test is a CASE (see
# _BY_ID).
_CLAIM_SQL = """
UPDATE inference_job AS j
   SET status = 'running', claim_token = %(token)s, claimed_at = %(now)s,
       lease_expires_at = %(now)s + %(lease_s)s * interval '1 second',
       attempts = j.attempts
                  + CASE WHEN j.status = 'running' AND j.worker = %(worker)s THEN 0
                         ELSE %(attempt)s END,
       worker = %(worker)s
  FROM inference_service AS s, inference_tenant AS t
 WHERE j.id = ANY(%(ids)s::uuid[]) AND s.id = j.service_id AND t.id = j.tenant_id
   AND CASE j.status
         WHEN 'queued' THEN true
         WHEN 'running' THEN j.id = ANY(%(redelivered)s::uuid[])
                             AND (j.attempts < %(max_attempts)s OR j.worker = %(worker)s)
         ELSE false
       END
RETURNING {columns},
          (SELECT r.backend_id FROM {route_table} AS r WHERE r.job_id = j.id)
"""

_CLAIM_TYPES = (
    ("token", "uuid"),
    ("now", "timestamptz"),
    ("lease_s", "float8"),
    ("attempt", "integer"),
    ("worker", "text"),
    ("ids", "uuid[]"),
    ("redelivered", "uuid[]"),
    ("max_attempts", "integer"),
)

# Sent ahead of a claim or a store that is its own transaction (one query string, so one
# implicit transaction: the setting ends with it). It is then visible at once but durable only
# when the WAL writer flushes it (within 3 x wal_writer_delay) or a later synchronous commit
# does. A Postgres crash in between can only undo it. An undone claim: the job is queued again,
# the store under the lost token writes nothing, and the lost-message sweep republishes it. An
# undone store: the job is running again under a lease nobody renews (renew_leases renews only
# claims made since the database started), so it is taken over and runs again, and its one
# completion is the rerun's. So neither waits on the disk on an idle realtime job's path.
ASYNC_COMMIT = "SET LOCAL synchronous_commit TO off;\n"

_POISON_SQL = """
UPDATE inference_job
   SET status = 'failed', finished_at = %(now)s, claim_token = NULL, dead_lettered_at = %(now)s,
       error = 'the worker running this job was lost ' || attempts || ' times; giving up'
 WHERE id = ANY(%(redelivered)s::uuid[]) AND status = 'running'
   AND attempts >= %(max_attempts)s AND worker IS DISTINCT FROM %(worker)s
RETURNING id
"""

# The audit trail's completion rows, one statement per batch, in the outcomes' transaction.
_AUDIT_COMPLETIONS_SQL = """
INSERT INTO inference_auditevent (at, kind, tenant_id, job_id, actor, detail)
SELECT clock_timestamp(), %(kind)s, tenant_id, id, worker,
       jsonb_build_object('status', status)
  FROM inference_job
 WHERE id = ANY(%(ids)s::uuid[]) AND status = ANY(%(statuses)s)
   AND (%(token)s::uuid IS NULL OR claim_token = %(token)s::uuid)
"""

# One statement for a whole batch, its rows as arrays (one shape, so it is prepared once); each
# row must still be held under the batch's claim token, and its status test is a CASE (see
# _BY_ID). Embedding vectors travel and are stored as float32 bytes (inference.jobs.vectors),
# not JSON. The audit trail's completion rows come from the same statement.
_SUCCEED_AND_AUDIT = PreparedStatement(
    "renq_store_successes",
    """
WITH done AS (
UPDATE inference_job AS j
   SET status = 'succeeded', result = v.result::jsonb, result_vectors = v.vectors,
       finished_at = clock_timestamp(), started_at = v.started_at,
       inference_ms = v.inference_ms, batch_size = v.batch_size, input_tokens = v.tokens
  FROM unnest(%(ids)s, %(results)s, %(vectors)s, %(started)s, %(inference_ms)s,
              %(batch_sizes)s, %(tokens)s)
       AS v(id, result, vectors, started_at, inference_ms, batch_size, tokens)
 WHERE j.id = v.id AND j.claim_token = %(token)s
   AND CASE j.status WHEN 'running' THEN true ELSE false END
RETURNING j.id, j.tenant_id, j.worker, j.status)
INSERT INTO inference_auditevent (at, kind, tenant_id, job_id, actor, detail)
SELECT clock_timestamp(), 'completed', tenant_id, id, worker, jsonb_build_object('status', status)
  FROM done
RETURNING job_id
""",
    (
        ("token", "uuid"),
        ("ids", "uuid[]"),
        ("results", "text[]"),
        ("vectors", "bytea[]"),
        ("started", "timestamptz[]"),
        ("inference_ms", "float8[]"),
        ("batch_sizes", "integer[]"),
        ("tokens", "integer[]"),
    ),
)
# A stored row's values, in this order.
_STORE_COLUMNS = ("ids", "results", "vectors", "started", "inference_ms", "batch_sizes", "tokens")


@dataclass
class Claim:
    """Jobs one worker now holds under `token`, and those found past their deadline."""

    token: uuid.UUID
    jobs: list[JobRow] = field(default_factory=list)
    expired: list[JobRow] = field(default_factory=list)
    # Redelivered too often (their workers kept dying): failed and dead-lettered.
    dead_lettered: list[uuid.UUID] = field(default_factory=list)
    # Job id → the backend its route chose, for the routed ones among `jobs`.
    route_backend_ids: dict[uuid.UUID, int] = field(default_factory=dict)


@dataclass
class Outcome:
    job: JobRow
    result: dict | None = None
    error: str = ""
    started_at: datetime | None = None
    inference_ms: float | None = None
    batch_size: int | None = None
    tokens: int | None = None
    # A failure that is a verdict on the job (its input makes the model raise): dead-letter it.
    dead_letter: bool = False
    # The name of the routed backend that produced it (None: an unrouted service's worker).
    backend: str | None = None


def missed_deadline(job: JobRow, now: datetime) -> bool:
    """Interactive jobs promise latency; batch and offline work waits as long as it takes,
    unless the request named its own deadline (deadline_ms)."""
    if job.deadline_at is not None and now > job.deadline_at:
        return True
    if not promises_latency(job.tier, job.requested_tier):
        return False
    return (now - job.created_at).total_seconds() > job.service.start_promise_s


def _audit(cursor, job_ids: list, kind: str, statuses: list[str], token=None) -> None:
    if job_ids:
        cursor.execute(
            _AUDIT_COMPLETIONS_SQL,
            {
                "kind": kind,
                "ids": [str(i) for i in job_ids],
                "statuses": list(statuses),
                "token": str(token) if token else None,
            },
        )


def _reproducible(outcome: Outcome) -> bool:
    """Whether running the job again would give this result (its service, as claimed, is of a
    kind without sampling); False when the job came without its service."""
    job = outcome.job
    return type(job).service.is_cached(job) and kind_of(job.service.kind).reproducible


# A prepared statement keeps its generic plan: one made on a small table (a new install, a
# TRUNCATE) would scan the whole table as it grew, one on a status index would read every
# entry a churning queue left dead there. Sequential scans off, and a status test no status
# index can serve (a CASE), leave the primary key whatever the statistics say.
_BY_ID = "SET LOCAL enable_seqscan TO off;\n"


def _execute_by_id(cursor, statement: PreparedStatement, params: dict, *, unflushed: bool):
    """`statement`'s rows: outside a transaction as one of its own, one round trip
    (`unflushed`: not waiting for the WAL flush); inside the caller's, the setting put back
    after it."""
    sql = statement.sql_for(cursor)
    if connection.in_atomic_block:
        cursor.execute(_BY_ID)
        cursor.execute(sql, params)
        rows = cursor.fetchall()
        cursor.execute("SET LOCAL enable_seqscan TO DEFAULT")
        return rows
    cursor.execute((ASYNC_COMMIT if unflushed else "") + _BY_ID + sql, params)
    return cursor.fetchall()


def _atomic_if(needed: bool, using: str):
    """A transaction around several statements; none around one (it is atomic by itself)."""
    return transaction.atomic(using=using) if needed else contextlib.nullcontext()


@functools.cache
def _claim_layout(model) -> tuple[PreparedStatement, list[tuple]]:
    """_CLAIM_SQL, prepared, returning the job's, its service's and its tenant's columns in
    the models' field order (what Model.from_db expects), and how to cut a returned row back
    into the three: (model, attnames, (field, db converters) pairs, slice). Built once per
    process: a claim runs between every two forward passes."""
    service = model._meta.get_field("service").related_model
    tenant = model._meta.get_field("tenant").related_model
    columns, layout, start = [], [], 0
    for alias, part in (("j", model), ("s", service), ("t", tenant)):
        fields = part._meta.concrete_fields
        columns += [f"{alias}.{f.column}" for f in fields]
        converters = [(f, f.get_db_converters(connection)) for f in fields]
        attnames = [f.attname for f in fields]
        layout.append((part, attnames, converters, slice(start, start + len(fields))))
        start += len(fields)
    sql = _CLAIM_SQL.format(columns=", ".join(columns), route_table=JobRoute._meta.db_table)
    return PreparedStatement(f"renq_claim_{model._meta.db_table}", sql, _CLAIM_TYPES), layout


def _claimed_jobs(model, rows: list[tuple], db: str) -> list[tuple[JobRow, int | None]]:
    """(job, its route's backend id) pairs, the job's service and tenant attached as
    select_related would build them."""
    job_layout, service_layout, tenant_layout = _claim_layout(model)[1]
    # The jobs of one claim share a few services and tenants: each is built once.
    services: dict = {}
    tenants: dict = {}
    jobs = []
    for row in rows:
        job = _from_row(db, row, job_layout)
        service = services.get(job.service_id)
        if service is None:
            service = services[job.service_id] = _from_row(db, row, service_layout)
        tenant = tenants.get(job.tenant_id)
        if tenant is None:
            tenant = tenants[job.tenant_id] = _from_row(db, row, tenant_layout)
        job.service = service
        job.tenant = tenant
        jobs.append((job, row[-1]))
    return jobs


def _from_row(db: str, row: tuple, layout: tuple):
    """What the ORM does with raw column values (JSON text → Python, for instance)."""
    part, attnames, converters, cut = layout
    values = []
    for value, (model_field, field_converters) in zip(row[cut], converters, strict=True):
        for convert in field_converters:
            value = convert(value, model_field, connection)
        values.append(value)
    return part.from_db(db, attnames, values)


def _finished_on_commit(
    model, job_ids: list, using: str, stored: Sequence[Outcome] = ()
) -> None:
    """Waiters hear of final jobs once the rows they will read are committed. `stored`: the
    successes among them whose rows this transaction wrote (their outcome is the row's)."""
    transaction.on_commit(
        lambda: signals.jobs_finished.send(model, job_ids=job_ids, stored=stored), using=using
    )



def _leaving(queryset: JobQuerySet, from_status: str, status: str, reason: str) -> None:
    signals.jobs_leaving.send(
        queryset.model, queryset=queryset, from_status=from_status, status=status, reason=reason
    )


def _finishing(queryset: JobQuerySet, from_status: str, **final) -> int:
    """A filtered move to a final status (`final`: the columns it writes); `jobs_finished`
    names the jobs it moves once that is committed, so their waiters answer at once, not on
    their next re-read. The ids are read before the move: one that joins it in between is
    moved unannounced (its waiters re-read), one that leaves it is announced for nothing (an
    announcement is a hint to look)."""
    moving = queryset.filter(status=from_status)
    job_ids = list(moving.values_list("pk", flat=True))
    if not job_ids:
        return 0
    moved = moving.update(**final)
    _finished_on_commit(queryset.model, job_ids, queryset.db)
    return moved


class JobQuerySet(models.QuerySet):
    # --- the worker's claim and its outcomes -------------------------------------------------

    def claim(
        self,
        job_ids: Sequence[str | uuid.UUID],
        *,
        redelivered_ids: Iterable[str | uuid.UUID] = (),
        worker: str = "",
        count_attempt: bool = True,
    ) -> Claim:
        """queued → running (or a takeover of a redelivered running job) under a new token.
        Interactive jobs that waited past their queue_timeout/total_timeout are marked
        expired instead; redelivered jobs lost `RENQ_MAX_ATTEMPTS` times fail (poison)."""
        token = uuid.uuid4()
        now = timezone.now()
        params: dict[str, Any] = {
            "token": token,
            "now": now,
            "worker": worker[:200],
            "ids": [str(i) for i in dict.fromkeys(job_ids)],
            "redelivered": [str(i) for i in redelivered_ids],
            "max_attempts": settings.RENQ_MAX_ATTEMPTS,
            "lease_s": settings.RENQ_LEASE_S,
            # A claim taken only to hand the job on (the sweep) runs nothing: no attempt.
            "attempt": 1 if count_attempt else 0,
        }
        claim = Claim(token=token)
        # Without redeliveries the claim is one statement, atomic by itself: no BEGIN and
        # COMMIT round trips around it (a claim runs before every forward pass; at idle it is on
        # a realtime job's path).
        redelivered = bool(params["redelivered"])
        with _atomic_if(redelivered, self.db), connection.cursor() as cursor:
            if redelivered:
                cursor.execute(_POISON_SQL, params)
                claim.dead_lettered = [row[0] for row in cursor.fetchall()]
                _audit(cursor, claim.dead_lettered, "dead_lettered", [JobStatus.FAILED])
            # Its own transaction need not wait for the WAL flush (see ASYNC_COMMIT).
            rows = _execute_by_id(cursor, _claim_layout(self.model)[0], params, unflushed=True)
        if not rows:
            return claim
        jobs = {job.pk: (job, route) for job, route in _claimed_jobs(self.model, rows, self.db)}
        for job_id in params["ids"]:
            job, route_backend_id = jobs.get(uuid.UUID(job_id), (None, None))
            if job is None:
                continue
            if missed_deadline(job, now):
                claim.expired.append(job)
                continue
            claim.jobs.append(job)
            if route_backend_id is not None:
                claim.route_backend_ids[job.pk] = route_backend_id
        if claim.expired:
            signals.jobs_ended.send(
                self.model, jobs=claim.expired, status=JobStatus.EXPIRED, reason="deadline"
            )
            self.model.objects.filter(
                pk__in=[j.pk for j in claim.expired], claim_token=token, status=JobStatus.RUNNING
            ).update(status=JobStatus.EXPIRED, finished_at=now, error=EXPIRED_IN_QUEUE)
            _finished_on_commit(self.model, [j.pk for j in claim.expired], self.db)
        return claim

    def store_outcomes(self, token: uuid.UUID, outcomes: Sequence[Outcome]) -> int:
        """running → succeeded | failed for one batch, one round trip each. Only rows still
        held under `token` change. Returns how many rows were written."""
        now = timezone.now()
        if not outcomes:
            return 0
        successes = [o for o in outcomes if o.result is not None]
        failures = [o for o in outcomes if o.result is None]
        rows = []
        for o in successes:
            result, vectors = split_result(o.result)
            rows.append(
                (
                    str(o.job.pk),
                    json.dumps(result),
                    None if vectors is None else Binary(vectors),
                    o.started_at or now,
                    o.inference_ms,
                    o.batch_size,
                    o.tokens,
                )
            )
        # A batch of successes is one statement, atomic by itself (no BEGIN/COMMIT round
        # trips): the job is finished one round trip after its forward pass. Its completion
        # audit rows come from the same statement, only for the rows it moved, so a second
        # store under the same claim (a redelivered message) records no second completion.
        written = 0
        succeeded: set[str] = set()
        # Its own transaction need not wait for the WAL flush when a crash that undid it would
        # only have the jobs computed again, to the same results (see ASYNC_COMMIT); a
        # caller's transaction commits as the caller decides.
        unflushed = not connection.in_atomic_block and all(map(_reproducible, outcomes))
        with _atomic_if(bool(failures), self.db), connection.cursor() as cursor:
            if unflushed and failures:
                cursor.execute(ASYNC_COMMIT)
            if rows:
                # The statement takes the batch column by column.
                columns = map(list, zip(*rows, strict=True))
                params = dict(zip(_STORE_COLUMNS, columns, strict=True))
                params["token"] = str(token)
                stored = _execute_by_id(cursor, _SUCCEED_AND_AUDIT, params, unflushed=unflushed)
                succeeded = {str(row[0]) for row in stored}
                written = len(succeeded)
            failed_now = [
                o.job.pk
                for o in failures
                if self.model.objects.filter(
                    pk=o.job.pk, claim_token=token, status=JobStatus.RUNNING
                ).update(
                    status=JobStatus.FAILED,
                    error=o.error[:4000],
                    started_at=o.started_at or now,
                    finished_at=now,
                    dead_lettered_at=now if o.dead_letter else None,
                )
            ]
            written += len(failed_now)
            _audit(cursor, failed_now, "completed", [JobStatus.FAILED], token)
        _finished_on_commit(
            self.model,
            [o.job.pk for o in outcomes],
            self.db,
            stored=[o for o in successes if str(o.job.pk) in succeeded],
        )
        signals.outcomes_stored.send(self.model, outcomes=outcomes)
        return written

    # --- moves on a filtered set ----------------------------------------------------------

    def release(self) -> int:
        """running → queued for claimed jobs this worker hands back unstarted (a peer may
        start them sooner), or holds as it is stopped on request: no job failed, so the
        attempt is not counted. The caller publishes them again (or their messages come back
        redelivered)."""
        return self.filter(status=JobStatus.RUNNING).update(
            status=JobStatus.QUEUED,
            claim_token=None,
            claimed_at=None,
            lease_expires_at=None,
            worker="",
            attempts=F("attempts") - 1,
        )

    def requeue(self) -> int:
        """running → queued, to be published again (a dead worker's claim, or a job handed to
        the next backend of its cascade). The attempt stays counted."""
        return self.filter(status=JobStatus.RUNNING).update(
            status=JobStatus.QUEUED,
            claim_token=None,
            claimed_at=None,
            lease_expires_at=None,
            started_at=None,
            published_at=None,
            worker="",
        )

    def fail(self, error: str) -> int:
        """running → failed without an outcome from a model: lost too often, or no backend
        of its cascade could run it; also a bulk parent whose pieces failed."""
        _leaving(self, JobStatus.RUNNING, JobStatus.FAILED, "gave_up")
        return _finishing(
            self,
            JobStatus.RUNNING,
            status=JobStatus.FAILED,
            finished_at=timezone.now(),
            error=error[:4000],
        )

    def finish_bulk(self, result: dict) -> int:
        """running → succeeded for a bulk parent, with its pieces' results assembled
        (vectors stored as bytes, as store_outcomes stores them)."""
        result, vectors = split_result(result)
        return _finishing(
            self.filter(is_bulk=True),
            JobStatus.RUNNING,
            status=JobStatus.SUCCEEDED,
            result=result,
            result_vectors=vectors,
            finished_at=timezone.now(),
        )

    def expire(self, reason: str) -> int:
        """queued → expired: nobody started it within its deadline."""
        _leaving(self, JobStatus.QUEUED, JobStatus.EXPIRED, "deadline")
        return _finishing(
            self,
            JobStatus.QUEUED,
            status=JobStatus.EXPIRED,
            finished_at=timezone.now(),
            error=reason,
        )

    def cancel(self) -> int:
        """queued → cancelled; a job a worker already claimed runs to its end."""
        _leaving(self, JobStatus.QUEUED, JobStatus.CANCELLED, "by_request")
        return _finishing(
            self,
            JobStatus.QUEUED,
            status=JobStatus.CANCELLED,
            finished_at=timezone.now(),
            error="cancelled by request",
        )

    def cancel_bulk(self) -> int:
        """running → cancelled for a bulk parent: its queued pieces are cancelled by the
        caller; pieces already running finish, and the chord's callback then finds nothing."""
        return _finishing(
            self.filter(is_bulk=True),
            JobStatus.RUNNING,
            status=JobStatus.CANCELLED,
            finished_at=timezone.now(),
            error="cancelled by request",
        )

    def revive(self) -> int:
        """failed → queued for dead-lettered jobs an operator sends back (admin "requeue");
        their attempts start again. The caller publishes them."""
        return self.filter(status=JobStatus.FAILED, dead_lettered_at__isnull=False).update(
            status=JobStatus.QUEUED,
            claim_token=None,
            claimed_at=None,
            started_at=None,
            finished_at=None,
            published_at=None,
            dead_lettered_at=None,
            attempts=0,
            error="",
        )

    # --- not status changes: leases, aging and the outbox stamp -----------------------------

    def renew_leases(self, worker: str, lease_s: float) -> int:
        """The worker still holds its running jobs: their leases run `lease_s` from now. A job
        taken over since is held by another worker (or queued) and is not touched, nor is one
        claimed before the database last started: a crash may have undone its store (see
        ASYNC_COMMIT), and its lease must lapse so that it runs again. A row another
        transaction holds (its store, most likely) is skipped, not waited for: the two lock
        the worker's rows in different orders and could deadlock, and a row not finishing is
        renewed again within a quarter of its lease."""
        held = self.filter(
            status=JobStatus.RUNNING,
            worker=worker[:200],
            claimed_at__gte=RawSQL("pg_postmaster_start_time()", ()),
        ).select_for_update(skip_locked=True)
        with transaction.atomic(using=self.db):
            return self.model.objects.filter(pk__in=held.values("pk")).update(
                lease_expires_at=timezone.now() + timedelta(seconds=lease_s)
            )

    def lapsed(self, now: datetime) -> JobQuerySet:
        """Running jobs whose lease ran out: their worker stopped renewing it."""
        return self.filter(status=JobStatus.RUNNING, lease_expires_at__lt=now)

    def promote(self, to_tier: str) -> int:
        """A queued job waiting past its tier's aging threshold now waits in `to_tier`'s queue
        (the caller re-publishes it there; whichever copy is claimed first runs it)."""
        return self.filter(status=JobStatus.QUEUED).update(serving_tier=to_tier)

    def mark_published(self) -> int:
        """RabbitMQ confirmed a dispatch message (a first one, or one sent again): the outbox
        sweep skips these jobs, and the lost-message sweep counts from now."""
        return self.filter(status=JobStatus.QUEUED).update(
            published_at=timezone.now(), held_start=None
        )

    def release_hold(self) -> int:
        """Held jobs leave Postgres for their queue: no longer held, and unconfirmed until their
        message is (mark_published), so the outbox sends them should that publish never
        complete (the releasing process dies mid-way)."""
        return self.filter(status=JobStatus.QUEUED).update(published_at=None, held_start=None)

    def hold_back(self, start: float | Expression) -> int:
        """Queued jobs whose turn in their tenant's fair share is still far off: no message
        goes out for them until it nears (inference.dispatch.publishing.release_held).
        `start`: their start tag (an expression: each row's)."""
        return self.filter(status=JobStatus.QUEUED).update(published_at=None, held_start=start)

    def held_back(self) -> JobQuerySet:
        """Queued jobs held back for their fair-share turn."""
        return self.filter(status=JobStatus.QUEUED, held_start__isnull=False)

    def unmark_published(self) -> int:
        """A publish counted on at INSERT failed: the outbox sweep sends these jobs."""
        return self.filter(status=JobStatus.QUEUED).update(published_at=None)
