"""Bulk jobs: one parent job split into pieces that run as a Celery chord.

The pieces are ordinary jobs (claimed atomically, batched, stored like any other), published to
the service's `bulk` queue. That queue is consumed by Celery only, never pulled by the batch
runner's TierQueueReader, so Celery sees every piece finish and the Redis result backend counts
the chord natively (no chord_unlock polling). The callback assembles the parent's result in
input order. A failed piece is retried on its own; the bulk is not restarted.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import chord, signature
from django.conf import settings
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from inference.admission import check_rate_limit
from inference.inputs import InputError, validate_input
from inference.models import Job, JobStatus, Service, Tenant
from inference.submission import resolve_service, resolve_tier
from inference.tiers import Tier, bulk_queue_name

MAX_BULK_ITEMS = 100_000
BULK_TIERS = (Tier.BATCH, Tier.OFFLINE)


@dataclass(frozen=True)
class BulkShape:
    """How one service kind's bulk input splits into piece inputs and merges back."""

    items_field: str
    split: Callable[[dict, list], dict]
    merge: Callable[[dict, list[dict]], dict]


def _merge_embeddings(bulk_input: dict, results: list[dict]) -> dict:
    vectors = [v for r in results for v in r["embeddings"]]
    return {"embeddings": vectors, "dim": results[0]["dim"] if results else 0}


def _merge_rerank(bulk_input: dict, results: list[dict]) -> dict:
    scores = [s for r in results for s in r["scores"]]
    ranking = sorted(range(len(scores)), key=lambda i: scores[i], reverse=True)
    if bulk_input.get("top_n"):
        ranking = ranking[: bulk_input["top_n"]]
    return {"scores": scores, "ranking": ranking}


def _merge_completions(bulk_input: dict, results: list[dict]) -> dict:
    return {"completions": results}


BULK_SHAPES: dict[str, BulkShape] = {
    "embedding": BulkShape(
        "texts",
        lambda bulk, chunk: {k: v for k, v in bulk.items() if k != "texts"} | {"texts": chunk},
        _merge_embeddings,
    ),
    "reranker": BulkShape(
        "documents",
        lambda bulk, chunk: {"query": bulk["query"], "documents": chunk},
        _merge_rerank,
    ),
    "llm": BulkShape(
        "prompts",
        lambda bulk, chunk: {
            "prompt": chunk[0],
            "max_tokens": bulk.get("max_tokens", 64),
            "temperature": bulk.get("temperature", 0.0),
        },
        _merge_completions,
    ),
}


def piece_size(service: Service) -> int:
    # One LLM piece per prompt (a job is one prompt); otherwise a piece is one full batch.
    return (
        1 if service.kind == "llm" else max(1, min(service.batch_size, service.max_items_per_job))
    )


def validate_bulk(service: Service, payload: Any) -> dict:
    shape = BULK_SHAPES[service.kind]
    if not isinstance(payload, dict):
        raise InputError("input", "must be a JSON object.")
    items = payload.get(shape.items_field)
    if not isinstance(items, list) or not items:
        raise InputError(f"input.{shape.items_field}", "must be a non-empty list of strings.")
    if len(items) > MAX_BULK_ITEMS:
        raise InputError(
            f"input.{shape.items_field}",
            f"has {len(items)} items; at most {MAX_BULK_ITEMS} are allowed in one bulk job.",
        )
    # Validate every piece with the single-job rules, reporting the bulk-level index.
    size = piece_size(service)
    for start in range(0, len(items), size):
        piece = shape.split(payload, items[start : start + size])
        try:
            validate_input(service.kind, piece, max_items=size)
        except InputError as exc:
            raise InputError(
                _bulk_field(exc.field, shape.items_field, start), exc.message
            ) from None
    extra = set(payload) - {
        shape.items_field,
        "query",
        "top_n",
        "normalize",
        "max_tokens",
        "temperature",
    }
    if extra:
        raise InputError(f"input.{sorted(extra)[0]}", "is not a known field.")
    return payload


def _bulk_field(field: str, items_field: str, offset: int) -> str:
    # "input.texts[3]" inside piece starting at 128 → "input.texts[131]"; LLM pieces name
    # their prompt "input.prompt".
    for name in (f"input.{items_field}[", "input.prompt"):
        if field.startswith(name):
            if name == "input.prompt":
                return f"input.{items_field}[{offset}]"
            index = int(field[len(name) :].split("]")[0])
            return f"input.{items_field}[{offset + index}]"
    return field


def submit_bulk(*, tenant: Tenant, service_name: Any, payload: Any, priority: Any = None) -> Job:
    service = resolve_service(service_name)
    tier = resolve_tier(priority if priority else Tier.BATCH, tenant)
    if tier not in BULK_TIERS:
        raise InputError("priority", "bulk jobs run at batch or offline priority.")
    payload = validate_bulk(service, payload)
    check_rate_limit(tenant, service)
    shape = BULK_SHAPES[service.kind]
    items = payload[shape.items_field]
    size = piece_size(service)
    with transaction.atomic():
        parent = Job.objects.create(
            tenant=tenant,
            service=service,
            tier=tier,
            message_priority=tenant.plan_boost,
            input=payload,
            is_bulk=True,
            status=JobStatus.RUNNING,
            started_at=timezone.now(),
        )
        pieces = Job.objects.bulk_create(
            Job(
                tenant=tenant,
                service=service,
                tier=tier,
                message_priority=tenant.plan_boost,
                input=shape.split(payload, items[start : start + size]),
                parent=parent,
                piece_index=index,
            )
            for index, start in enumerate(range(0, len(items), size))
        )
        transaction.on_commit(lambda: dispatch_bulk(parent, pieces))
    return parent


def dispatch_bulk(parent: Job, pieces: list[Job]) -> None:
    queue = bulk_queue_name(parent.service.name)
    header = [
        signature(
            "inference.run_job",
            args=[str(piece.pk)],
            queue=queue,
            priority=parent.message_priority,
            ignore_result=False,
        )
        for piece in pieces
    ]
    # The callback is light (one query, one update): it runs on the same service's workers,
    # so a bulk job needs no extra consumer.
    # Immutable: the pieces' task results are reports; the callback reads results from
    # Postgres, the record of truth.
    callback = signature(
        "inference.finish_bulk", args=[str(parent.pk)], queue=queue, immutable=True
    )
    errback = signature("inference.fail_bulk", args=[str(parent.pk)], queue=queue, immutable=True)
    chord(header)(callback.set(link_error=[errback]))
    now = timezone.now()
    Job.objects.filter(pk__in=[p.pk for p in pieces]).update(published_at=now)
    Job.objects.filter(pk=parent.pk).update(published_at=now)


def bulk_progress(parent: Job) -> dict:
    counts = parent.pieces.aggregate(
        total=Count("id"),
        done=Count("id", filter=Q(status=JobStatus.SUCCEEDED)),
        failed=Count("id", filter=Q(status__in=[JobStatus.FAILED, JobStatus.EXPIRED])),
    )
    return counts


def requeue_failed_piece(job_id: str) -> bool:
    """Put a failed bulk piece back to queued for a retry, while it has attempts left."""
    return bool(
        Job.objects.filter(
            pk=job_id,
            parent__isnull=False,
            status=JobStatus.FAILED,
            attempts__lt=settings.RENQ_MAX_ATTEMPTS,
        ).update(status=JobStatus.QUEUED, claim_token=None, finished_at=None)
    )


def finish_bulk(parent_id: str) -> str:
    """Chord callback: assemble the pieces' results in input order."""
    parent = Job.objects.select_related("service").get(pk=parent_id)
    pieces = list(parent.pieces.order_by("piece_index").only("status", "result", "error"))
    failed = [(i, p) for i, p in enumerate(pieces) if p.status != JobStatus.SUCCEEDED]
    now = timezone.now()
    if failed:
        reasons = "; ".join(f"piece {i}: {p.status} {p.error}" for i, p in failed[:20])
        Job.objects.filter(pk=parent.pk, status=JobStatus.RUNNING).update(
            status=JobStatus.FAILED,
            finished_at=now,
            error=f"{len(failed)} of {len(pieces)} pieces did not succeed: {reasons}",
        )
        return JobStatus.FAILED
    shape = BULK_SHAPES[parent.service.kind]
    result = shape.merge(parent.input, [p.result for p in pieces])
    Job.objects.filter(pk=parent.pk, status=JobStatus.RUNNING).update(
        status=JobStatus.SUCCEEDED, result=result, finished_at=now
    )
    return JobStatus.SUCCEEDED


def fail_bulk(parent_id: str, *_args: Any) -> None:
    Job.objects.filter(pk=parent_id, status=JobStatus.RUNNING).update(
        status=JobStatus.FAILED, finished_at=timezone.now(), error="a piece's task crashed"
    )
