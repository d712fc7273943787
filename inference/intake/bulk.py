"""Bulk jobs: one parent job split into pieces, each an ordinary job of the parent's tenant and
tier (Issue #27).

A piece is routed at submission like any job (a local tier queue, or io.<tier> for a cloud
backend), waits in its tier queue charged to the tier's share and its tenant's fair share,
ages, goes down its route's cascade when an attempt fails, and is rescued when its workers are
gone. The bulk is admitted whole against the queue by its own budget (inference.intake.
admission: past its tenant's share of the queue, its pieces take no room from other tenants).
Whoever stores the last piece's outcome assembles the parent's result in input order; the
sweep finishes any parent whose pieces are all final and that was left running (its finisher
died, or a piece ended without an outcome).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.db import DatabaseError, IntegrityError, OperationalError, transaction
from django.db.models import Count, Exists, OuterRef, Q
from django.utils import timezone

from inference.dispatch.placement import routes_on_submit
from inference.dispatch.publishing import publish_many, publish_many_on_commit
from inference.intake.admission import QueueCapacityCheck, RunningJobsCheck, reserve_counters
from inference.intake.audit import record_receipts
from inference.intake.entitlements import TierChoice, plan_tier
from inference.intake.row_writer import OutcomeUnknown, may_have_committed, run_in_one_round_trip
from inference.intake.submission import (
    clean_idempotency_key,
    replay,
    resolve_service,
    resolve_tier,
)
from inference.jobs.inputs import InputError
from inference.jobs.kinds import CHARS_PER_TOKEN, kind_of
from inference.jobs.status import TERMINAL_STATUSES
from inference.jobs.tiers import Tier
from inference.jobs.vectors import with_vectors
from inference.models import Job, JobStatus, Service, Tenant
from inference.scheduling.cost_model import BatchCostModel, preemption_budget_s
from routing.models import JobRoute

logger = logging.getLogger(__name__)

MAX_BULK_ITEMS = 100_000
BULK_TIERS = (Tier.BATCH, Tier.OFFLINE)
BULK_OPTIONS = {"query", "top_n", "normalize", "max_tokens", "temperature"}


def piece_size(service: Service, items: list) -> int:
    """Items per piece. One LLM piece per prompt (a job is one prompt). Otherwise as many as
    fit the preemption budget on the slowest device measured (a piece runs as one job, so it
    must not hold a realtime job up longer than a batch may), at least batch_size, at most
    max_items_per_job: larger pieces mean fewer tasks, claims and stores per item."""
    kind = kind_of(service.kind)
    if kind.one_item_per_piece:
        return 1
    floor = max(1, min(service.batch_size, service.max_items_per_job))
    models = BatchCostModel.measured(service.name).values()
    if not models or not items:
        return floor
    slowest = max(models, key=lambda cost: cost.per_token_s)
    sample = items[: min(len(items), 256)]
    tokens_per_item = max(1.0, sum(len(str(i)) for i in sample) / len(sample) / CHARS_PER_TOKEN)
    fitting = int(slowest.tokens_within(preemption_budget_s(service)) / tokens_per_item)
    return max(floor, min(fitting, service.max_items_per_job))


def split_bulk(service: Service, payload: Any) -> list[dict]:
    """The validated input of every piece, or InputError naming the bulk-level field."""
    kind = kind_of(service.kind)
    items_field = kind.bulk_items_field
    if not isinstance(payload, dict):
        raise InputError("input", "must be a JSON object.")
    extra = set(payload) - BULK_OPTIONS - {items_field}
    if extra:
        raise InputError(f"input.{sorted(extra)[0]}", "is not a known field.")
    items = payload.get(items_field)
    if not isinstance(items, list) or not items:
        raise InputError(f"input.{items_field}", "must be a non-empty list of strings.")
    if len(items) > MAX_BULK_ITEMS:
        raise InputError(
            f"input.{items_field}",
            f"has {len(items)} items; at most {MAX_BULK_ITEMS} are allowed in one bulk job.",
        )
    top_n = payload.get("top_n")
    if top_n is not None and (isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1):
        raise InputError("input.top_n", "must be a positive integer.")
    # Validate every piece with the single-job rules, reporting the bulk-level index.
    size = piece_size(service, items)
    pieces = []
    for start in range(0, len(items), size):
        piece = kind.bulk_piece(payload, items[start : start + size])
        try:
            pieces.append(kind.validate(piece, max_items=size, field="input"))
        except InputError as exc:
            raise InputError(_bulk_field(exc.field, items_field, start), exc.message) from None
    return pieces


def _bulk_field(field: str, items_field: str, offset: int) -> str:
    # "input.texts[3]" inside piece starting at 128 → "input.texts[131]"; LLM pieces name
    # their prompt "input.prompt".
    if field == "input.prompt":
        return f"input.{items_field}[{offset}]"
    prefix = f"input.{items_field}["
    if field.startswith(prefix):
        index = int(field[len(prefix) :].split("]")[0])
        return f"input.{items_field}[{offset + index}]"
    return field


def submit_bulk(
    *,
    tenant: Tenant,
    service_name: Any,
    payload: Any,
    priority: Any = None,
    idempotency_key: str = "",
    actor: str = "",
) -> Job:
    """One request, admitted or refused whole: it counts once against the rate limits and
    running-jobs quota, with all its tokens against the monthly budget, and its pieces against
    the service's queue by the bulk's own budget: past the tenant's share of the queue they
    take no room from other tenants (QueueCapacityCheck).

    With an `idempotency_key` the tenant sent with the same bulk job in the last 24 h, returns
    that job (with `job.replayed = True`) and creates nothing; InputError if it was sent with
    another request."""
    key = clean_idempotency_key(idempotency_key)
    service = resolve_service(service_name)
    # Only null or "" mean the default (batch): any other value, `{}` or `0` too, is checked.
    requested = resolve_tier(
        Tier.BATCH if priority is None or priority == "" else priority, tenant
    )
    if requested not in BULK_TIERS:
        raise InputError("priority", "bulk jobs run at batch or offline priority.")
    tier = bulk_tier(requested, tenant)
    if key and (replayed := replay(tenant, key, [(service, payload)], bulk=True)) is not None:
        return replayed[0]
    piece_inputs = split_bulk(service, payload)
    kind = kind_of(service.kind)
    tokens = sum(sum(kind.estimate_tokens(piece)) for piece in piece_inputs)
    reservation = reserve_counters(tenant, service, jobs=1, tokens=tokens)
    try:
        return _store_bulk(tenant, service, tier, payload, piece_inputs, actor, key)
    except BaseException as exc:
        reservation.release()
        # A concurrent request with the same key won the race: answer with its job.
        if isinstance(exc, IntegrityError) and key:
            replayed = replay(tenant, key, [(service, payload)], bulk=True)
            if replayed is not None:
                return replayed[0]
        raise


def bulk_tier(requested: Tier, tenant: Tenant) -> TierChoice:
    """The plan's tier for a bulk job, kept within batch..offline: a bulk promises no latency,
    and an interactive tier's queue_timeout would expire the pieces that wait their turn."""
    choice = plan_tier(requested, tenant)
    if choice.served in BULK_TIERS:
        return choice
    # Boosted above batch: batch is as high as a bulk goes.
    if requested == Tier.BATCH:
        return TierChoice(requested, Tier.BATCH)
    return TierChoice(requested, Tier.BATCH, f"{choice.reason} (bulk jobs: at most batch)")


def _store_bulk(tenant, service, tier, payload, piece_inputs, actor: str, key: str) -> Job:
    now = timezone.now()  # created and started at once: no negative queue_wait_ms
    # The pieces are the parent's jobs: its tenant, service and tiers.
    shared = dict(
        tenant=tenant,
        service=service,
        tier=tier.served,
        requested_tier=tier.requested,
        tier_reason=tier.reason,
        message_priority=tenant.plan_boost,
    )
    parent = Job(
        **shared,
        input=payload,
        is_bulk=True,
        status=JobStatus.RUNNING,
        created_at=now,
        started_at=now,
        idempotency_key=key,
    )
    # published_at set at INSERT, as the submit path does: a failed publish clears it.
    pieces = [
        Job(
            **shared,
            input=piece_input,
            parent=parent,
            piece_index=index,
            created_at=now,
            published_at=now,
        )
        for index, piece_input in enumerate(piece_inputs)
    ]
    # One decision for them all (they share service and tier), made before the locks.
    routes = routes_on_submit(pieces)
    # The queue's lock before the tenant's, as every submitter takes them.
    checks = [
        QueueCapacityCheck(service, tier.served, len(pieces), tenant=tenant, bulk=True),
        RunningJobsCheck(tenant, 1),
    ]
    committing = False
    try:
        with transaction.atomic():
            run_in_one_round_trip([sql for check in checks if (sql := check.statement())])
            parent.save(force_insert=True)
            Job.objects.bulk_create(pieces)
            JobRoute.objects.bulk_create(routes)
            record_receipts([parent], actor=actor)
            publish_many_on_commit(pieces, counted_on=True)
            committing = True
    except DatabaseError as exc:
        if committing and isinstance(exc, OperationalError) and may_have_committed(exc):
            # The COMMIT's reply was lost: the pieces may be stored, each counted as
            # published, and without a message one would wait for the lost-message sweep.
            # The client is told 503; a message for a piece not stored is dropped at claim.
            publish_many(pieces, counted_on=True, commit_unknown=True)
            raise OutcomeUnknown(*exc.args) from exc
        refusal = next((r for check in checks if (r := check.refusal(exc)) is not None), None)
        if refusal is not None:
            raise refusal from None
        raise
    return parent


_PROGRESS = {
    "total": Count("id"),
    "done": Count("id", filter=Q(status=JobStatus.SUCCEEDED)),
    "failed": Count("id", filter=Q(status__in=[JobStatus.FAILED, JobStatus.EXPIRED])),
}


def bulk_progress(parent: Job) -> dict:
    return parent.pieces.aggregate(**_PROGRESS)


def bulk_progresses(jobs: Iterable[Job]) -> dict:
    """`bulk_progress` of each bulk job among `jobs`, by id, in one query: a page of bulk jobs
    costs one count, not one per job."""
    parents = [job.pk for job in jobs if job.is_bulk]
    if not parents:
        return {}
    counted = {
        row.pop("parent_id"): row
        for row in Job.objects.filter(parent_id__in=parents)
        .values("parent_id")
        .annotate(**_PROGRESS)
        .order_by()
    }
    empty = {"total": 0, "done": 0, "failed": 0}
    return {pk: counted.get(pk, empty) for pk in parents}


def finish_bulk(parent_id: str) -> str:
    """Assemble the pieces' results in input order (or fail the parent with the pieces'
    reasons); called once every piece is final."""
    parent = Job.objects.select_related("service").get(pk=parent_id)
    pieces = list(
        parent.pieces.order_by("piece_index").only("status", "result", "result_vectors", "error")
    )
    failed = [(i, p) for i, p in enumerate(pieces) if p.status != JobStatus.SUCCEEDED]
    running = Job.objects.filter(pk=parent.pk)
    if failed:
        reasons = "; ".join(f"piece {i}: {p.status} {p.error}" for i, p in failed[:20])
        running.fail(f"{len(failed)} of {len(pieces)} pieces did not succeed: {reasons}")
        return JobStatus.FAILED
    results = [with_vectors(p.result, p.result_vectors) for p in pieces]
    result = kind_of(parent.service.kind).bulk_merge(parent.input, results)
    running.finish_bulk(result)
    return JobStatus.SUCCEEDED


def finish_done_bulks(parent_ids: Iterable | None = None) -> int:
    """Finish the running bulk parents (of `parent_ids`, or any) whose pieces are all final.
    Two finishers of one parent are harmless: only a running parent is finished."""
    unfinished = Job.objects.filter(parent=OuterRef("pk")).exclude(status__in=TERMINAL_STATUSES)
    done = Job.objects.filter(is_bulk=True, status=JobStatus.RUNNING).exclude(Exists(unfinished))
    if parent_ids is not None:
        done = done.filter(pk__in=list(parent_ids))
    return sum(finish_bulk(str(pk)) is not None for pk in done.values_list("pk", flat=True)[:100])


def finish_stalled_bulks() -> int:
    """The sweep's: parents whose last piece ended without an outcome (expired, given up on),
    or whose finisher died before it assembled them."""
    return finish_done_bulks()


def on_outcomes_stored(sender, *, outcomes, **_kwargs) -> None:
    """The state machine's `outcomes_stored` (connected in InferenceConfig.ready()): a bulk
    parent is finished by whoever stores its last piece, once that store is committed."""
    parent_ids = {o.job.parent_id for o in outcomes if o.job.parent_id is not None}
    if parent_ids:
        transaction.on_commit(lambda: _finish_quietly(parent_ids))


def _finish_quietly(parent_ids: set) -> None:
    try:
        finish_done_bulks(parent_ids)
    except Exception:  # noqa: BLE001 - the outcomes are stored; the sweep finishes the parent
        logger.exception("could not finish bulk job(s) %s; the sweep will", sorted(parent_ids))
