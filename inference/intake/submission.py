"""The submit service: the one way a job enters renq (REST API, OpenAI API, bulk, demo, tests).

validate (400 names the field, or says why no configured backend can serve the job; the tier
is the requested one moved by the tenant's plan, `inference.intake.entitlements`) →
Idempotency-Key replay → result cache → admission (429 with Retry-After, a request admitted or
refused whole; realtime past the plan's cap is served as api) → routing decision → [queue
capacity check (503) → running-jobs check (429) → INSERT jobs, receipts, routes → COMMIT]: one
round trip, shared with the submissions that arrived meanwhile
(`inference.intake.group_commit`) → publish (after commit, so a worker never sees a job that
does not exist).
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.utils import timezone

from inference.dispatch.head_start import offer_head_start
from inference.dispatch.placement import check_servable, routes_on_submit, token_estimate
from inference.dispatch.publishing import (
    RUN_JOB_TASK,
    destination,
    hand_to_outbox,
    publish_many,
    publish_many_on_commit,
)
from inference.intake.admission import (
    CounterReservation,
    QueueCapacityCheck,
    RunningJobsCheck,
    refuse_overdue_lines,
    refuse_while_broker_away,
    reserve_counters,
)
from inference.intake.audit import receipts, record_event
from inference.intake.entitlements import plan_tier, realtime_cap_reason, reserve_realtime
from inference.intake.group_commit import GroupCommit
from inference.intake.lookups import active_service, forget_all
from inference.intake.row_writer import (
    OutcomeUnknown,
    insert_statements,
    mark_saved,
    run_in_one_round_trip,
)
from inference.jobs.inputs import InputError, check_storable_text
from inference.jobs.kinds import kind_of, validate_input
from inference.jobs.tiers import TIER_NAMES, Tier, promises_latency
from inference.models import Job, JobStatus, Service, Tenant

logger = logging.getLogger(__name__)

# The header a client sends its key in (REST and /v1 alike).
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
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
    try:
        publish_many(jobs, counted_on=True)
    except Exception:
        # Committed: the submitters are told their jobs were accepted, and they were.
        logger.warning("could not publish %d committed jobs", len(jobs), exc_info=True)
        hand_to_outbox([job.pk for job in jobs])


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
    """The tier the request asks for (the tenant's default when it names none)."""
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
    """The result-cache key: per tenant (another tenant's inputs are never revealed), per model
    (a changed model_ref does not serve the old model's answers), and of the input as the
    engine runs it, the service's defaults filled in (normalize_embeddings): a changed default
    is a new key, and naming the default is the same request."""
    engine_input = kind_of(service.kind).engine_payload(service, payload)
    canonical = json.dumps(engine_input, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(
        f"{tenant.pk}:{service.pk}:{service.model_ref}:{canonical}".encode()
    ).hexdigest()


def cacheable(service: Service, payload: dict) -> bool:
    """Whether the result cache serves and keeps answers to this input: only where the same
    input always gets the same answer. A generation sampled at a temperature above 0 is a new
    draw each time; greedy decoding (temperature 0) is not."""
    return service.enable_cache and float(payload.get("temperature", 0.0)) == 0.0


def effective_deadline_s(service: Service, deadline_ms: int | None) -> float:
    """How long a request for the service may take to its answer: the service's total_timeout,
    which the request's own deadline (deadline_ms, X-Renq-Deadline-Ms) may tighten, never
    loosen."""
    if deadline_ms is None:
        return service.total_timeout
    return min(deadline_ms / 1000, service.total_timeout)


@dataclass
class JobRequest:
    """A validated submission, not yet admitted. `tier` is the tier it is served in, after the
    plan's entitlements; `requested_tier` the one it asked for (None: the same)."""

    service: Service
    tier: Tier
    input: dict
    deadline_ms: int | None = None
    requested_tier: Tier | None = None
    # Why tier is not requested_tier.
    tier_reason: str = ""
    # The new job's id, when the caller chose it (a front door that subscribes to the job's
    # notification before submitting it); a fresh one otherwise.
    job_id: uuid.UUID | None = None
    # The caller offered the job's head start already (inference.dispatch.head_start).
    head_start_offered: bool = False
    # The caller waits for the job's outcome and answers with it (a synchronous front door):
    # its commit need not wait for the WAL flush (GroupCommit), and the caller waits for the
    # flush before it answers without an outcome (row_writer.wait_until_flushed).
    caller_waits: bool = False

    @property
    def tokens(self) -> int:
        return sum(token_estimate(self.service, self.input))


def prepare(
    tenant: Tenant,
    *,
    service_name: Any,
    payload: Any,
    priority: Any = None,
    deadline_ms=None,
    job_id: uuid.UUID | None = None,
    head_start_offered: bool = False,
    caller_waits: bool = False,
) -> JobRequest:
    service = resolve_service(service_name)
    tier = plan_tier(resolve_tier(priority, tenant), tenant)
    clean = validate_input(service.kind, payload, max_items=service.max_items_per_job)
    check_servable(service, tier.served, clean)
    return JobRequest(
        service=service,
        tier=tier.served,
        input=clean,
        deadline_ms=resolve_deadline_ms(deadline_ms),
        requested_tier=tier.requested,
        tier_reason=tier.reason,
        job_id=job_id,
        head_start_offered=head_start_offered,
        caller_waits=caller_waits,
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
    job_id: uuid.UUID | None = None,
    head_start_offered: bool = False,
    caller_waits: bool = False,
) -> Job:
    """Validate, admit and store one job (with `job_id`, if given); its dispatch message is
    published after commit. `head_start_offered`: the caller offered its head start already.
    `caller_waits`: the caller waits for the outcome (see JobRequest.caller_waits).

    Raises InputError (400, names the field; UnservableJob when no configured backend can
    serve it) or AdmissionRefused (429/503 with Retry-After).
    With an `idempotency_key` already used by the tenant in the last 24 h, returns that job
    (with `job.replayed = True`) and creates nothing; InputError if it was used for another
    request.
    """
    key = clean_idempotency_key(idempotency_key)
    prepared = partial(
        prepare,
        tenant,
        service_name=service_name,
        payload=payload,
        priority=priority,
        deadline_ms=deadline_ms,
        job_id=job_id,
        head_start_offered=head_start_offered,
        caller_waits=caller_waits,
    )
    request = prepared()
    try:
        return submit_jobs(tenant, [request], idempotency_key=key, listed=False, actor=actor)[0]
    except IntegrityError:
        if Service.objects.filter(pk=request.service.pk).exists():
            raise
    # The cached service was deleted (and maybe recreated) since it was cached: look again.
    forget_all()
    return submit_jobs(tenant, [prepared()], idempotency_key=key, listed=False, actor=actor)[0]


def submit_jobs(
    tenant: Tenant,
    requests: Sequence[JobRequest],
    *,
    idempotency_key: str = "",
    listed: bool = True,
    actor: str = "",
) -> list[Job]:
    """`accept`, safe to retry with an Idempotency-Key: a request sent again with the key (in
    the last 24 h) gets the jobs the first one made, each with `replayed = True`, and nothing
    is created; the key sent with another request is an InputError. `listed`: the requests
    are the items of a list (each of its jobs keeps the key in its own form)."""
    key = clean_idempotency_key(idempotency_key)
    sent = [(request.service, request.input) for request in requests]
    if key:
        replayed = replay(tenant, key, sent, listed=listed)
        if replayed is not None:
            return replayed
    try:
        return accept(
            tenant,
            requests,
            actor=actor,
            idempotency_keys=stored_keys(key, len(requests), listed=listed),
        )
    except IntegrityError:
        # A concurrent request with the same key won the race: answer with its jobs.
        replayed = replay(tenant, key, sent, listed=listed) if key else None
        if replayed is None:
            raise
        return replayed


def accept(
    tenant: Tenant,
    requests: Sequence[JobRequest],
    *,
    actor: str = "",
    idempotency_keys: Sequence[str] = (),
) -> list[Job]:
    """Admit and store validated requests, all or none; publish them after commit.

    A request the result cache answers is admitted like the others (rate limits, requests per
    minute, token budget) and stored in the same transaction, already succeeded; it neither
    queues nor runs, so it takes no room in the queue (max_queue_size) and is not one of the
    tenant's running jobs (max_running_jobs)."""
    keys = list(idempotency_keys) or [""] * len(requests)
    now = timezone.now()
    digests = [""] * len(requests)  # the result-cache key of each cacheable request
    answers: dict[int, Job] = {}  # the cached answer to each request that has one
    for i, request in enumerate(requests):
        if cacheable(request.service, request.input):
            digests[i] = input_digest(request.service, tenant, request.input)
            hit = _cached_answer(tenant, request, digests[i], now)
            if hit is not None:
                answers[i] = hit
    pending = [i for i in range(len(requests)) if i not in answers]

    reservations: list[CounterReservation] = [CounterReservation()]
    try:
        requests = _within_realtime_cap(tenant, requests, pending, reservations[0])
        by_service: dict[int, list[int]] = defaultdict(list)
        for i, request in enumerate(requests):
            by_service[request.service.pk].append(i)
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
        created = [_new_job(tenant, requests[i], now, keys[i], digests[i]) for i in pending]
        answered = {
            i: _answered_job(tenant, requests[i], hit, now, keys[i], digests[i])
            for i, hit in answers.items()
        }
        routes = routes_on_submit(created)
        interactive = [job for job in created if promises_latency(job.tier, job.requested_tier)]
        refuse_while_broker_away(interactive)
        refuse_overdue_lines(
            tenant, [job for job in interactive if destination(job).task == RUN_JOB_TASK]
        )
        receipt_rows = receipts(created, actor=actor)
        queued_by_service: dict[int, list[int]] = defaultdict(list)
        for i in pending:
            queued_by_service[requests[i].service.pk].append(i)
        # Services in id order, then the tenant: every submitter takes its locks in one order.
        checks: list[QueueCapacityCheck | RunningJobsCheck] = [
            _capacity_check(tenant, requests, queued_by_service[pk])
            for pk in sorted(queued_by_service)
        ]
        checks.append(RunningJobsCheck(tenant, len(pending)))
        checked = [(check, sql) for check in checks if (sql := check.statement()) is not None]
        # The admission checks, the jobs, their receipts and routes: one round trip, one
        # transaction (the caller's, or PostgreSQL's implicit one for the query string).
        statements = [sql for _, sql in checked]
        statements += insert_statements(created + list(answered.values()), receipt_rows, routes)
        # published_at is set at INSERT (no UPDATE per job after the confirm); a failed
        # publish clears it for the outbox.
        try:
            if connection.in_atomic_block:
                # In a caller's transaction: a savepoint, and the publish at its commit.
                with transaction.atomic():
                    run_in_one_round_trip(statements)
                publish_many_on_commit(created, counted_on=True)
            else:
                lock_order = tuple(check.lock_key for check, _ in checked)
                if len(created) == 1 and not requests[pending[0]].head_start_offered:
                    # Before the commit: an idle worker starts the pass meanwhile, and may
                    # be handed the job once it is committed.
                    created[0].head_start_offered = offer_head_start(created[0])
                durable = not all(requests[i].caller_waits for i in pending)
                _group_commit.submit(statements, created, lock_order=lock_order, durable=durable)
        except OutcomeUnknown:
            if not connection.in_atomic_block:
                # The jobs may be stored, each counted as published: without a message one
                # would wait for the lost-message sweep. A message for a job that was not
                # stored is dropped at its claim. The client is still told 503.
                publish_many(created, counted_on=True, commit_unknown=True)
            raise
        except DatabaseError as exc:
            refusal = next((r for c, _ in checked if (r := c.refusal(exc)) is not None), None)
            if refusal is not None:
                raise refusal from None
            raise
        mark_saved(created, answered.values(), receipt_rows, routes)
    except BaseException:
        for reservation in reservations:
            reservation.release()
        raise
    jobs = dict(zip(pending, created, strict=True)) | answered
    return [jobs[i] for i in range(len(requests))]


def _within_realtime_cap(
    tenant: Tenant,
    requests: Sequence[JobRequest],
    pending: list[int],
    reservation: CounterReservation,
) -> Sequence[JobRequest]:
    """The requests with the realtime ones past the plan's realtime cap served as api (a cache
    hit runs nothing, so it takes none of the cap)."""
    realtime = [i for i in pending if requests[i].tier == Tier.REALTIME]
    admitted, cap = reserve_realtime(tenant, len(realtime), reservation)
    if admitted == len(realtime):
        return requests
    served = list(requests)
    for i in realtime[admitted:]:
        reasons = [requests[i].tier_reason, realtime_cap_reason(tenant, cap or 0)]
        served[i] = replace(
            requests[i],
            tier=Tier.API,
            requested_tier=requests[i].requested_tier or Tier.REALTIME,
            tier_reason="; ".join(r for r in reasons if r),
        )
    return served


def _capacity_check(
    tenant: Tenant, requests: Sequence[JobRequest], indexes: list[int]
) -> QueueCapacityCheck:
    service = requests[indexes[0]].service
    realtime = sum(requests[i].tier == Tier.REALTIME for i in indexes)
    # Non-realtime work must fit below the realtime reserve; realtime may fill the queue.
    tier = Tier.BATCH if len(indexes) > realtime else Tier.REALTIME
    return QueueCapacityCheck(service, tier, len(indexes), tenant)


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


def _new_job(tenant: Tenant, request: JobRequest, now, idempotency_key: str, digest: str) -> Job:
    service = request.service
    deadline_at = None
    if request.deadline_ms is not None:
        # The interactive tiers promise an answer within total_timeout: a deadline only
        # tightens that. Batch work promises none, so its deadline is the one asked for.
        if promises_latency(request.tier, request.requested_tier or ""):
            deadline_at = now + timedelta(
                seconds=effective_deadline_s(service, request.deadline_ms)
            )
        else:
            deadline_at = now + timedelta(milliseconds=request.deadline_ms)
    job = _job_rows.build(
        tenant,
        service,
        tier=request.tier,
        requested_tier=request.requested_tier or request.tier,
        tier_reason=request.tier_reason,
        message_priority=tenant.plan_boost,
        input=request.input,
        input_hash=digest,
        created_at=now,
        published_at=now,
        deadline_at=deadline_at,
        idempotency_key=idempotency_key,
        **({"id": request.job_id} if request.job_id is not None else {}),
    )
    job.head_start_offered = request.head_start_offered
    return job


def _cached_answer(tenant: Tenant, request: JobRequest, digest: str, now) -> Job | None:
    """The latest job that computed the answer to this input within the cache's TTL (a copy
    made by an earlier hit is no source: the TTL counts from the computation)."""
    ttl = timedelta(seconds=settings.RENQ_RESULT_CACHE_TTL_S)
    return (
        Job.objects.filter(
            tenant=tenant,
            service=request.service,
            input_hash=digest,
            status=JobStatus.SUCCEEDED,
            cached=False,
            created_at__gte=now - ttl,
        )
        .only("result", "result_vectors")
        .first()
    )


def _answered_job(
    tenant: Tenant, request: JobRequest, hit: Job, now, idempotency_key: str, digest: str
) -> Job:
    """A job of its own for a cache hit, already succeeded with a copy of the answer."""
    job = _job_rows.build(
        tenant,
        request.service,
        tier=request.tier,
        requested_tier=request.requested_tier or request.tier,
        tier_reason=request.tier_reason,
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
        idempotency_key=idempotency_key,
    )
    Job.route.related.set_cached_value(job, None)  # never routed: no query for its route
    return job


def clean_idempotency_key(key: Any) -> str:
    if not key:
        return ""
    if not isinstance(key, str) or len(key) > MAX_IDEMPOTENCY_KEY_CHARS:
        raise InputError(
            "Idempotency-Key", f"must be a string of at most {MAX_IDEMPOTENCY_KEY_CHARS} chars."
        )
    return key.strip()


def _list_item_key(key: str, index: int) -> str:
    """The form of `key` the index-th job of a list keeps (a key is unique per tenant, and a
    list makes several jobs). It starts with a space, which a key as sent never does (keys
    are stripped), so no client's key is ever taken for it; a key too long to fit with its
    index is kept as its digest."""
    stored = f" {index} {key}"
    if len(stored) > MAX_IDEMPOTENCY_KEY_CHARS:
        stored = f" {index} sha256:{hashlib.sha256(key.encode()).hexdigest()}"
    return stored


def stored_keys(key: str, count: int, *, listed: bool) -> list[str]:
    """The idempotency key each of a request's `count` jobs is stored with."""
    if not key:
        return [""] * count
    return [_list_item_key(key, i) for i in range(count)] if listed else [key] * count


def replay(
    tenant: Tenant,
    key: str,
    sent: Sequence[tuple[Service, Any]],
    *,
    listed: bool = False,
    bulk: bool = False,
) -> list[Job] | None:
    """The jobs a request sent with `key` in the last 24 h made, in order, each with
    `replayed = True`; None if the key made none. `sent`: this request's (service, input) per
    job. InputError (400) when the key was sent with another request: other jobs, another
    number of them, a list for one job, a bulk job for an ordinary one or the other way."""
    own = stored_keys(key, len(sent), listed=listed)
    # Where the key would be if another shape of request had been sent with it: as it is,
    # and a list's forms up to one past this request's own count.
    probe = {key, *own, *(_list_item_key(key, i) for i in range(len(own) + 1 if listed else 1))}
    found = {
        job.idempotency_key: job
        for job in Job.objects.select_related("service", "route__backend").filter(
            tenant=tenant, idempotency_key__in=probe
        )
    }
    since = timezone.now() - IDEMPOTENCY_WINDOW
    expired = [job.pk for job in found.values() if job.created_at < since]
    if expired:
        # Expired: the key is free again (it is unique per tenant, so the old jobs let go).
        Job.objects.filter(pk__in=expired).update(idempotency_key="")
        found = {k: job for k, job in found.items() if job.pk not in expired}
    if not found:
        return None
    jobs = [found.get(k) for k in own]
    same = len(found) == len(own) and all(
        job is not None
        and (job.service_id, job.is_bulk, job.input) == (service.pk, bulk, job_input)
        for job, (service, job_input) in zip(jobs, sent, strict=True)
    )
    if not same:
        raise InputError(
            "Idempotency-Key",
            "was sent with a different request in the last 24 h; a new request needs a new key.",
        )
    for job in jobs:
        job.replayed = True
    return jobs  # type: ignore[return-value]


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
