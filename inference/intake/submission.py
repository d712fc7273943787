"""The submit service: the one way a job enters renq (REST API, OpenAI API, bulk, demo, tests).

validate (400 names the field) → admission (429 with Retry-After, a request admitted or
refused whole) → routing decision → [queue capacity check (503) → INSERT jobs, receipts,
routes → COMMIT]: one round trip, shared with the submissions that arrived meanwhile
(`inference.intake.group_commit`) → publish (after commit, so a worker never sees a job that does
not exist).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from inference.dispatch.placement import routes_on_submit
from inference.dispatch.publishing import publish_many, publish_many_on_commit
from inference.intake.admission import QueueCapacityCheck, check_running_jobs, reserve_counters
from inference.intake.audit import receipts, record_event
from inference.intake.group_commit import GroupCommit
from inference.intake.lookups import active_service, forget_all
from inference.intake.row_writer import insert_statements, mark_saved, run_in_one_round_trip
from inference.jobs.inputs import InputError, check_storable_text
from inference.jobs.kinds import kind_of, validate_input
from inference.jobs.tiers import TIER_NAMES, Tier
from inference.models import Job, JobStatus, Service, Tenant

# An Idempotency-Key returns the job it first created for this long.
IDEMPOTENCY_WINDOW = timedelta(hours=24)
MAX_IDEMPOTENCY_KEY_CHARS = 200
# Longest deadline a request may ask for (a week: beyond that it is not a deadline).
MAX_DEADLINE_MS = 7 * 24 * 3600 * 1000
# Most jobs in one POST /api/v1/jobs list.
MAX_JOBS_PER_REQUEST = 1000


def _publish_submitted(jobs: Sequence[Job]) -> None:
    if len({job.tier for job in jobs}) > 1:
        # A group's realtime jobs first: their confirm does not wait behind the other tiers'.
        jobs = sorted(jobs, key=lambda job: Tier(job.tier).rank)
    publish_many(jobs, counted_on=True)


# Submissions made at the same time by this process's threads commit and publish together.
_group_commit = GroupCommit(run_in_one_round_trip, _publish_submitted)


def resolve_service(name: Any) -> Service:
    if not isinstance(name, str) or not name:
        raise InputError("service", "is required and must be a service name.")
    # A NUL or a lone surrogate cannot even be sent to PostgreSQL in a query (a 500 otherwise).
    check_storable_text(name, "service")
    service = active_service(name)
    if service is None:
        known = ", ".join(Service.objects.filter(active=True).values_list("name", flat=True))
        raise InputError("service", f"unknown service '{name}'; known: {known}.")
    return service


def resolve_tier(priority: Any, tenant: Tenant) -> Tier:
    if priority is None or priority == "":
        return Tier(tenant.default_tier)
    if not isinstance(priority, str) or priority not in TIER_NAMES:
        raise InputError("priority", f"must be one of {', '.join(Tier.values)}.")
    return Tier(priority)


def resolve_deadline_ms(deadline_ms: Any) -> int | None:
    if deadline_ms is None:
        return None
    if isinstance(deadline_ms, bool) or not isinstance(deadline_ms, int):
        raise InputError("deadline_ms", "must be an integer number of milliseconds.")
    if not 1 <= deadline_ms <= MAX_DEADLINE_MS:
        raise InputError("deadline_ms", f"must be from 1 to {MAX_DEADLINE_MS}.")
    return deadline_ms


def input_digest(service: Service, tenant: Tenant, payload: dict) -> str:
    """The result-cache key: per tenant (another tenant's inputs are never revealed) and per
    model (a changed model_ref does not serve the old model's answers)."""
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(
        f"{tenant.pk}:{service.pk}:{service.model_ref}:{canonical}".encode()
    ).hexdigest()


@dataclass
class JobRequest:
    """A validated submission, not yet admitted."""

    service: Service
    tier: Tier
    input: dict
    deadline_ms: int | None = None

    @property
    def tokens(self) -> int:
        return sum(kind_of(self.service.kind).estimate_tokens(self.input))


def prepare(
    tenant: Tenant, *, service_name: Any, payload: Any, priority: Any = None, deadline_ms=None
) -> JobRequest:
    service = resolve_service(service_name)
    return JobRequest(
        service=service,
        tier=resolve_tier(priority, tenant),
        input=validate_input(service.kind, payload, max_items=service.max_items_per_job),
        deadline_ms=resolve_deadline_ms(deadline_ms),
    )


def submit_job(
    *,
    tenant: Tenant,
    service_name: Any,
    payload: Any,
    priority: Any = None,
    deadline_ms: Any = None,
    idempotency_key: str = "",
    actor: str = "",
) -> Job:
    """Validate, admit and store one job; its dispatch message is published after commit.

    Raises InputError (400, names the field) or AdmissionRefused (429/503 with Retry-After).
    With an `idempotency_key` already used by the tenant in the last 24 h, returns that job
    (with `job.replayed = True`) and creates nothing.
    """
    key = _clean_idempotency_key(idempotency_key)
    if key:
        existing = _replay(tenant, key)
        if existing is not None:
            return existing
    request = prepare(
        tenant,
        service_name=service_name,
        payload=payload,
        priority=priority,
        deadline_ms=deadline_ms,
    )
    try:
        return accept(tenant, [request], actor=actor, idempotency_key=key)[0]
    except IntegrityError:
        # A concurrent request with the same key won the race: answer with its job.
        replay = _replay(tenant, key) if key else None
        if replay is not None:
            return replay
        if Service.objects.filter(pk=request.service.pk).exists():
            raise
    # The cached service was deleted (and maybe recreated) since it was cached: look again.
    forget_all()
    request = prepare(
        tenant, service_name=service_name, payload=payload, priority=priority,
        deadline_ms=deadline_ms,
    )  # fmt: skip
    return accept(tenant, [request], actor=actor, idempotency_key=key)[0]


def accept(
    tenant: Tenant, requests: Sequence[JobRequest], *, actor: str = "", idempotency_key: str = ""
) -> list[Job]:
    """Admit and store validated requests, all or none; publish them after commit."""
    jobs: list[Job | None] = [None] * len(requests)
    pending: list[int] = []
    for i, request in enumerate(requests):
        hit = _cache_hit(tenant, request)
        if hit is not None:
            jobs[i] = hit
        else:
            pending.append(i)
    if not pending:
        return jobs  # type: ignore[return-value]

    reservations = []
    try:
        by_service: dict[int, list[int]] = defaultdict(list)
        for i in pending:
            by_service[requests[i].service.pk].append(i)
        for indexes in by_service.values():
            service = requests[indexes[0]].service
            reservations.append(
                reserve_counters(
                    tenant,
                    service,
                    jobs=len(indexes),
                    tokens=sum(requests[i].tokens for i in indexes),
                )
            )
        check_running_jobs(tenant, len(pending))
        now = timezone.now()
        created = [_new_job(tenant, requests[i], now, idempotency_key) for i in pending]
        routes = routes_on_submit(created)
        receipt_rows = receipts(created, actor=actor)
        # Services in id order: two lists naming the same services lock them alike.
        checks = [_capacity_check(requests, by_service[pk]) for pk in sorted(by_service)]
        # The capacity checks, the jobs, their receipts and routes: one round trip, one
        # transaction (the caller's, or PostgreSQL's implicit one for the query string).
        statements = [s for c in checks if (s := c.statement()) is not None]
        statements += insert_statements(created, receipt_rows, routes)
        # published_at is set at INSERT (no UPDATE per job after the confirm); a failed
        # publish clears it for the outbox.
        try:
            if connection.in_atomic_block:
                # In a caller's transaction: a savepoint, and the publish at its commit.
                with transaction.atomic():
                    run_in_one_round_trip(statements)
                publish_many_on_commit(created, counted_on=True)
            else:
                _group_commit.submit(statements, created, lock_order=tuple(sorted(by_service)))
        except DatabaseError as exc:
            refusal = next((r for c in checks if (r := c.refusal(exc)) is not None), None)
            if refusal is not None:
                raise refusal from None
            raise
        mark_saved(created, receipt_rows, routes)
    except BaseException:
        for reservation in reservations:
            reservation.release()
        raise
    for i, job in zip(pending, created, strict=True):
        jobs[i] = job
    return jobs  # type: ignore[return-value]


def _capacity_check(requests: Sequence[JobRequest], indexes: list[int]) -> QueueCapacityCheck:
    service = requests[indexes[0]].service
    realtime = sum(requests[i].tier == Tier.REALTIME for i in indexes)
    # Non-realtime work must fit below the realtime reserve; realtime may fill the queue.
    tier = Tier.BATCH if len(indexes) > realtime else Tier.REALTIME
    return QueueCapacityCheck(service, tier, len(indexes))


class NewJobRow:
    """Builds unsaved Job instances from their fields' positions. `Job(**fields)` resolves
    every field it is not given (a default call per field, keyword lookups), per job, on the
    submit path. Here the defaults are taken once, and only the callable ones (the id) are
    called per job."""

    def __init__(self, model: type[Job] = Job):
        self.model = model
        fields = model._meta.concrete_fields
        self.attnames = [f.attname for f in fields]
        self.index = {name: i for i, name in enumerate(self.attnames)}
        # Called per job (the id); the others' defaults are constants (0, "", False, None).
        self.per_job = [
            (i, f.default) for i, f in enumerate(fields) if f.has_default() and callable(f.default)
        ]
        called = {i for i, _ in self.per_job}
        self.defaults = [None if i in called else f.get_default() for i, f in enumerate(fields)]

    def build(self, tenant: Tenant, service: Service, **values: Any) -> Job:
        row = list(self.defaults)
        for i, default in self.per_job:
            row[i] = default()
        index = self.index
        for name, value in values.items():
            row[index[name]] = value
        row[index["tenant_id"]] = tenant.pk
        row[index["service_id"]] = service.pk
        job = self.model(*row)
        # As Job(tenant=..., service=...) leaves them: no query when they are read.
        job.tenant, job.service = tenant, service
        return job


_job_rows = NewJobRow()


def _new_job(tenant: Tenant, request: JobRequest, now, idempotency_key: str) -> Job:
    service = request.service
    deadline_at = None
    if request.deadline_ms is not None:
        deadline_at = now + timedelta(milliseconds=request.deadline_ms)
    return _job_rows.build(
        tenant,
        service,
        tier=request.tier,
        message_priority=tenant.plan_boost,
        input=request.input,
        input_hash=input_digest(service, tenant, request.input) if service.enable_cache else "",
        created_at=now,
        published_at=now,
        deadline_at=deadline_at,
        idempotency_key=idempotency_key,
    )


def _cache_hit(tenant: Tenant, request: JobRequest) -> Job | None:
    service = request.service
    if not service.enable_cache:
        return None
    digest = input_digest(service, tenant, request.input)
    hit = (
        Job.objects.filter(
            tenant=tenant, service=service, input_hash=digest, status=JobStatus.SUCCEEDED
        )
        .only("result", "result_vectors")
        .first()
    )
    if hit is None:
        return None
    now = timezone.now()
    return Job.objects.create(
        tenant=tenant,
        service=service,
        tier=request.tier,
        message_priority=tenant.plan_boost,
        status=JobStatus.SUCCEEDED,
        input=request.input,
        input_hash=digest,
        result=hit.result,
        result_vectors=hit.result_vectors,  # the stored bytes, copied as they are
        cached=True,
        created_at=now,
        started_at=now,
        finished_at=now,
        inference_ms=0.0,
    )


def _clean_idempotency_key(key: Any) -> str:
    if not key:
        return ""
    if not isinstance(key, str) or len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise InputError(
            "Idempotency-Key", f"must be a string of at most {MAX_IDEMPOTENCY_KEY_CHARS} chars."
        )
    return key.strip()


def _replay(tenant: Tenant, key: str) -> Job | None:
    job = (
        Job.objects.select_related("service", "route__backend")
        .filter(tenant=tenant, idempotency_key=key)
        .first()
    )
    if job is None:
        return None
    if job.created_at < timezone.now() - IDEMPOTENCY_WINDOW:
        # Expired: the key is free again (it is unique per tenant, so the old job lets go).
        Job.objects.filter(pk=job.pk).update(idempotency_key="")
        return None
    job.replayed = True
    return job


def cancel_job(job: Job, *, actor: str = "") -> bool:
    """Cancel a queued job (a bulk job: its queued pieces, and the parent when none has run).
    Returns False if a worker already claimed or finished it."""
    if job.is_bulk:
        cancelled = Job.objects.filter(parent=job).cancel()
        cancelled += Job.objects.filter(pk=job.pk).cancel_bulk()
    else:
        cancelled = Job.objects.filter(pk=job.pk).cancel()
    job.refresh_from_db()
    if cancelled:
        record_event("cancelled", job=job, actor=actor)
    return bool(cancelled)


def requeue_dead_lettered(jobs, *, actor: str) -> int:
    """Send dead-lettered jobs back to their queues (an operator's decision), attempts reset."""
    ids = list(jobs.filter(dead_lettered_at__isnull=False).values_list("pk", flat=True))
    with transaction.atomic():
        revived = Job.objects.filter(pk__in=ids).revive()
        requeued = list(Job.objects.filter(pk__in=ids).select_related("service", "route__backend"))
        for job in requeued:
            record_event(
                "admin_change", job=job, actor=actor, detail={"action": "requeued dead letter"}
            )
        publish_many_on_commit(requeued)
    return revived
