"""The Batch API's lifecycle: upload, validate, run lines as offline renq jobs, finalize.

    validating ──(file fine)──▶ in_progress ──(every line ended)──▶ finalizing ──▶ completed
        └──(bad file: errors name the lines)──▶ failed
    in_progress ──cancel──▶ cancelling ──(running lines ended)──▶ cancelled
    in_progress ──(completion window passed)──▶ expired

`advance_batch` makes one step and is driven by a Celery task on the control queue that
re-schedules itself every TICK_S while the batch is active (the sweep restarts a stalled
chain). Each step runs under the batch row's lock, so two steps never submit the same line;
a line's job and its link are committed together, so a restart resumes exactly where it stopped.
Lines are submitted through submit_job as `offline` jobs, at most IN_FLIGHT_LINES at a time: a
batch never floods the queue, and realtime work (served first by the GPU workers) overtakes it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from datetime import timedelta

from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone

from inference.batch_api.models import (
    Batch,
    BatchFile,
    BatchRequest,
    BatchStatus,
    FilePurpose,
)
from inference.dispatch.queues import control_queue
from inference.intake.admission import AdmissionRefused
from inference.intake.submission import submit_job
from inference.jobs.inputs import InputError
from inference.jobs.tiers import Tier
from inference.models import Job, JobStatus, Service, Tenant
from inference.openai_api.endpoints import ENDPOINTS, prepare
from inference.openai_api.errors import OpenAIError, bad_request, from_input_error, not_found
from renq_site.celery import app

logger = logging.getLogger(__name__)

# OpenAI's limits: 50,000 requests and 200 MB per input file. Files sit in Postgres, so the
# size limit is kept lower.
MAX_FILE_LINES = 50_000
MAX_FILE_BYTES = 100 * 1024 * 1024
COMPLETION_WINDOWS = {"24h": timedelta(hours=24)}
MAX_METADATA_KEYS = 16
# Validation stops listing errors after this many (the batch fails on the first anyway).
MAX_LISTED_ERRORS = 100
# Lines queued or running at once per batch, and lines submitted per step.
IN_FLIGHT_LINES = 256
TICK_S = 1.0
# A batch not advanced for this long lost its task chain; the sweep starts a new one.
STALLED_AFTER_S = 30.0

ADVANCE_TASK = "inference.advance_batch"
ACTIVE_JOB = (JobStatus.QUEUED, JobStatus.RUNNING)
ENDED_BADLY = (JobStatus.FAILED, JobStatus.EXPIRED)


# --- files --------------------------------------------------------------------------------


def create_file(*, tenant: Tenant, purpose: str, filename: str, content: bytes) -> BatchFile:
    if purpose != FilePurpose.BATCH:
        raise bad_request("purpose must be 'batch'.", "purpose")
    if len(content) > MAX_FILE_BYTES:
        raise OpenAIError(
            413,
            f"files are limited to {MAX_FILE_BYTES} bytes.",
            param="file",
            code="file_too_large",
        )
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_request("the file must be UTF-8 JSONL.", "file") from None
    if text.count("\n") + 1 > MAX_FILE_LINES + 1:
        raise bad_request(f"a batch file holds at most {MAX_FILE_LINES} lines.", "file")
    return BatchFile.objects.create(
        tenant=tenant,
        purpose=purpose,
        filename=filename[:255] or "batch.jsonl",
        bytes=len(content),
        content=content,
    )


def _uuid_of(public_id: str, prefix: str) -> str | None:
    hex_part = public_id.removeprefix(prefix)
    return hex_part if len(hex_part) == 32 and public_id.startswith(prefix) else None


def get_file(tenant: Tenant, file_id: str) -> BatchFile:
    """The tenant's file; another tenant's is indistinguishable from a missing one (404)."""
    pk = _uuid_of(file_id, "file-")
    found = BatchFile.objects.filter(pk=pk, tenant=tenant).first() if pk else None
    if found is None:
        raise not_found("file", file_id)
    return found


def file_object(file: BatchFile) -> dict:
    return {
        "id": file.public_id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": int(file.created_at.timestamp()),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


# --- batches: creation, reading, cancel -----------------------------------------------------


def create_batch(
    *,
    tenant: Tenant,
    input_file_id: object,
    endpoint: object,
    completion_window: object,
    metadata: object = None,
) -> Batch:
    if endpoint not in ENDPOINTS:
        raise bad_request(f"endpoint must be one of {', '.join(ENDPOINTS)}.", "endpoint")
    if completion_window not in COMPLETION_WINDOWS:
        raise bad_request("completion_window must be '24h'.", "completion_window")
    if metadata is not None and (
        not isinstance(metadata, dict)
        or len(metadata) > MAX_METADATA_KEYS
        or not all(isinstance(v, str) for v in metadata.values())
    ):
        raise bad_request(
            f"metadata must be an object of up to {MAX_METADATA_KEYS} string values.", "metadata"
        )
    if not isinstance(input_file_id, str):
        raise bad_request("input_file_id is required.", "input_file_id")
    input_file = get_file(tenant, input_file_id)
    if input_file.purpose != FilePurpose.BATCH:
        raise bad_request("the input file's purpose must be 'batch'.", "input_file_id")
    now = timezone.now()
    batch = Batch.objects.create(
        tenant=tenant,
        endpoint=endpoint,
        input_file=input_file,
        completion_window=completion_window,
        metadata=metadata,
        created_at=now,
        expires_at=now + COMPLETION_WINDOWS[completion_window],
    )
    schedule_advance_on_commit(batch)
    return batch


def get_batch(tenant: Tenant, batch_id: str) -> Batch:
    pk = _uuid_of(batch_id, "batch_")
    found = (
        Batch.objects.filter(pk=pk, tenant=tenant).select_related("input_file").first()
        if pk
        else None
    )
    if found is None:
        raise not_found("batch", batch_id)
    return found


def list_batches(tenant: Tenant, *, after: str | None, limit: int) -> tuple[list[Batch], bool]:
    batches = Batch.objects.filter(tenant=tenant).select_related("input_file")
    if after:
        cursor = get_batch(tenant, after)
        batches = batches.filter(
            Q(created_at__lt=cursor.created_at) | Q(created_at=cursor.created_at, id__lt=cursor.id)
        )
    page = list(batches.order_by("-created_at", "-id")[: limit + 1])
    return page[:limit], len(page) > limit


def cancel_batch(tenant: Tenant, batch_id: str) -> Batch:
    """→ cancelling at once: lines not yet submitted never will be and queued jobs are
    cancelled; the next step finalizes (cancelled) once the running ones end."""
    with transaction.atomic():
        batch = get_batch(tenant, batch_id)
        batch = Batch.objects.select_for_update().select_related("input_file").get(pk=batch.pk)
        if batch.status in (BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS):
            batch.status = BatchStatus.CANCELLING
            batch.cancelling_at = timezone.now()
            batch.save(update_fields=["status", "cancelling_at"])
            Job.objects.filter(batch_request__batch=batch).cancel()
            schedule_advance_on_commit(batch)
        elif batch.status != BatchStatus.CANCELLING:
            raise OpenAIError(
                409,
                f"batch {batch.public_id} is {batch.status}; it cannot be cancelled.",
                code="batch_not_cancellable",
            )
    return batch


def _ts(value) -> int | None:
    return int(value.timestamp()) if value is not None else None


def batch_object(batch: Batch) -> dict:
    return {
        "id": batch.public_id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": batch.errors} if batch.errors else None,
        "input_file_id": batch.input_file.public_id,
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": f"file-{batch.output_file_id.hex}" if batch.output_file_id else None,
        "error_file_id": f"file-{batch.error_file_id.hex}" if batch.error_file_id else None,
        "created_at": _ts(batch.created_at),
        "in_progress_at": _ts(batch.in_progress_at),
        "expires_at": _ts(batch.expires_at),
        "finalizing_at": _ts(batch.finalizing_at),
        "completed_at": _ts(batch.completed_at),
        "failed_at": _ts(batch.failed_at),
        "expired_at": _ts(batch.expired_at),
        "cancelling_at": _ts(batch.cancelling_at),
        "cancelled_at": _ts(batch.cancelled_at),
        "request_counts": {
            "total": batch.request_total,
            "completed": batch.request_completed,
            "failed": batch.request_failed,
        },
        "metadata": batch.metadata,
    }


# --- the steps ------------------------------------------------------------------------------


def schedule_advance(batch_id, countdown_s: float = 0.0) -> None:
    """Send the next step to the control queue (task inference.advance_batch)."""
    app.send_task(
        ADVANCE_TASK, args=[str(batch_id)], queue=control_queue(), countdown=countdown_s or None
    )


def schedule_advance_on_commit(batch: Batch) -> None:
    transaction.on_commit(lambda: schedule_advance(batch.pk))


def advance_batch(batch_id) -> bool:
    """One step of the batch's lifecycle. Returns True while the batch needs more steps."""
    with transaction.atomic():
        batch = (
            Batch.objects.select_for_update(skip_locked=True)
            .select_related("input_file")
            .filter(pk=batch_id)
            .first()
        )
        if batch is None:  # gone, or another step holds it: that one goes on
            return False
        if batch.is_final:
            return False
        now = timezone.now()
        batch.advanced_at = now
        if batch.status == BatchStatus.VALIDATING:
            _validate(batch, now)
        elif batch.status == BatchStatus.IN_PROGRESS:
            if now >= batch.expires_at:
                Job.objects.filter(batch_request__batch=batch).cancel()
            else:
                _submit_more(batch)
        if not batch.is_final:
            in_flight = _count(batch)
            if batch.status != BatchStatus.VALIDATING and not in_flight:
                if batch.status == BatchStatus.CANCELLING or not _unsubmitted(batch).exists():
                    _finalize(batch, now)
                elif now >= batch.expires_at:
                    _finalize(batch, now)
        batch.save()
        return not batch.is_final


def _validate(batch: Batch, now) -> None:
    """Every line is a request to the batch's endpoint with a unique custom_id and a known
    model; otherwise the batch fails, its errors naming the lines."""
    errors: list[dict] = []
    requests: list[BatchRequest] = []
    seen: set[str] = set()
    kinds: dict[str, str | None] = {}
    expected_kind = ENDPOINTS[batch.endpoint].kind

    def error(line: int, code: str, message: str, param: str | None = None) -> None:
        if len(errors) < MAX_LISTED_ERRORS:
            errors.append({"code": code, "message": message, "param": param, "line": line})

    for line, text in _lines(bytes(batch.input_file.content)):
        try:
            item = json.loads(text)
        except json.JSONDecodeError as exc:
            error(line, "invalid_json_line", f"line {line} is not valid JSON: {exc.msg}.")
            continue
        if not isinstance(item, dict):
            error(line, "invalid_request", f"line {line} must be a JSON object.")
            continue
        custom_id = item.get("custom_id")
        if not isinstance(custom_id, str) or not custom_id:
            error(line, "missing_required_parameter", "custom_id is required.", "custom_id")
            continue
        if custom_id in seen:
            error(
                line, "duplicate_custom_id", f"custom_id '{custom_id}' is used twice.", "custom_id"
            )
            continue
        seen.add(custom_id)
        if item.get("method", "POST") != "POST":
            error(line, "invalid_method", "method must be POST.", "method")
        if item.get("url") != batch.endpoint:
            error(
                line,
                "mismatched_endpoint",
                f"url '{item.get('url')}' differs from the batch's endpoint '{batch.endpoint}'.",
                "url",
            )
        body = item.get("body")
        if not isinstance(body, dict):
            error(line, "invalid_request", "body must be a JSON object.", "body")
            continue
        model = body.get("model")
        if model not in kinds:
            kinds[model] = (
                Service.objects.filter(name=model, active=True).values_list("kind", flat=True)
                if isinstance(model, str)
                else Service.objects.none()
            ).first()
        if kinds[model] is None:
            error(line, "model_not_found", f"model '{model}' does not exist.", "body.model")
        elif kinds[model] != expected_kind:
            error(
                line,
                "model_not_supported",
                f"model '{model}' cannot serve {batch.endpoint}.",
                "body.model",
            )
        requests.append(BatchRequest(batch=batch, line=line, custom_id=custom_id, body=body))
    if not requests and not errors:
        error(1, "empty_file", "the input file has no requests.")
    if len(requests) > MAX_FILE_LINES:
        error(MAX_FILE_LINES + 1, "too_many_requests", f"more than {MAX_FILE_LINES} requests.")
    if errors:
        batch.status, batch.failed_at, batch.errors = BatchStatus.FAILED, now, errors
        return
    BatchRequest.objects.bulk_create(requests, batch_size=2000)
    batch.request_total = len(requests)
    batch.status, batch.in_progress_at = BatchStatus.IN_PROGRESS, now


def _lines(content: bytes) -> Iterator[tuple[int, str]]:
    """(1-based line number, text); a trailing newline is not an empty last line, but a blank
    line inside the file is an error (as OpenAI's validation has it)."""
    lines = content.decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    for number, text in enumerate(lines, start=1):
        yield number, text.rstrip("\r")


def _unsubmitted(batch: Batch):
    return batch.requests.filter(job__isnull=True, error__isnull=True)


def _submit_more(batch: Batch) -> None:
    in_flight = batch.requests.filter(job__status__in=ACTIVE_JOB).count()
    room = IN_FLIGHT_LINES - in_flight
    if room <= 0:
        return
    endpoint = ENDPOINTS[batch.endpoint]
    for request in _unsubmitted(batch).order_by("line")[:room]:
        try:
            job_request = prepare(endpoint, request.body)
            job = submit_job(
                tenant=batch.tenant,
                service_name=job_request.service.name,
                payload=job_request.payload,
                priority=Tier.OFFLINE,
            )
        except OpenAIError as exc:
            request.error = {"status_code": exc.status, **exc.body()}
        except InputError as exc:
            refused = from_input_error(exc, endpoint.field_names)
            request.error = {"status_code": refused.status, **refused.body()}
        except AdmissionRefused as exc:
            # Rate limit or full queue: the rest of the lines wait for the next step.
            logger.info("batch %s waits: %s", batch.public_id, exc)
            break
        else:
            request.job, request.options = job, job_request.options
        request.save(update_fields=["job", "options", "error"])


def _count(batch: Batch) -> int:
    """Refresh request_counts; return how many lines are queued or running."""
    counts = batch.requests.aggregate(
        completed=Count("pk", filter=Q(job__status=JobStatus.SUCCEEDED)),
        failed=Count("pk", filter=Q(job__status__in=ENDED_BADLY) | Q(error__isnull=False)),
        in_flight=Count("pk", filter=Q(job__status__in=ACTIVE_JOB)),
    )
    batch.request_completed = counts["completed"]
    batch.request_failed = counts["failed"]
    return counts["in_flight"]


def _finalize(batch: Batch, now) -> None:
    """Write the output and error files, then end the batch (completed, cancelled, expired)."""
    batch.finalizing_at = now
    expiring = batch.status != BatchStatus.CANCELLING and now >= batch.expires_at
    output, errors = _result_lines(batch, expiring=expiring)
    if output:
        batch.output_file = _output_file(batch, "output", output)
    if errors:
        batch.error_file = _output_file(batch, "errors", errors)
    _count(batch)
    if batch.status == BatchStatus.CANCELLING:
        batch.status, batch.cancelled_at = BatchStatus.CANCELLED, now
    elif expiring:
        batch.status, batch.expired_at = BatchStatus.EXPIRED, now
    else:
        batch.status, batch.completed_at = BatchStatus.COMPLETED, now


def _result_lines(batch: Batch, *, expiring: bool) -> tuple[list[bytes], list[bytes]]:
    """Successes for the output file, failures for the error file, in OpenAI's line shape.
    Lines a cancelled batch never ran appear in neither; an expired batch lists them as
    errors (batch_expired)."""
    endpoint = ENDPOINTS[batch.endpoint]
    output: list[bytes] = []
    errors: list[bytes] = []
    requests = batch.requests.select_related("job__service").order_by("line")
    for request in requests.iterator(chunk_size=1000):
        job = request.job
        line = {"id": request.public_id, "custom_id": request.custom_id}
        if request.error is not None:
            status_code = request.error["status_code"]
            body = {"error": request.error["error"]}
            errors.append(_jsonl({**line, "response": _response(status_code, None, body)}))
        elif job is not None and job.status == JobStatus.SUCCEEDED:
            try:
                answer = endpoint.render(job, request.options)
            except OpenAIError as exc:
                errors.append(_jsonl({**line, "response": _response(exc.status, job, exc.body())}))
            else:
                output.append(_jsonl({**line, "response": _response(200, job, answer)}))
        elif job is not None and job.status in ENDED_BADLY:
            failure = {"error": {"message": job.error, "type": "server_error", "code": job.status}}
            errors.append(_jsonl({**line, "response": _response(500, job, failure)}))
        elif expiring:
            errors.append(
                _jsonl(
                    {
                        **line,
                        "response": None,
                        "error": {
                            "code": "batch_expired",
                            "message": "the batch expired before this request ran.",
                        },
                    }
                )
            )
    return output, errors


def _response(status_code: int, job: Job | None, body: dict) -> dict:
    return {
        "status_code": status_code,
        "request_id": str(job.pk) if job is not None else None,
        "body": body,
    }


def _jsonl(line: dict) -> bytes:
    line.setdefault("error", None)
    return json.dumps(line, separators=(",", ":")).encode() + b"\n"


def _output_file(batch: Batch, kind: str, lines: list[bytes]) -> BatchFile:
    content = b"".join(lines)
    return BatchFile.objects.create(
        tenant=batch.tenant,
        purpose=FilePurpose.BATCH_OUTPUT,
        filename=f"{batch.public_id}_{kind}.jsonl",
        bytes=len(content),
        content=content,
    )


def stalled_batch_ids(now=None) -> list:
    """Active batches whose step chain stopped (its message lost with a worker)."""
    now = now or timezone.now()
    return list(
        Batch.objects.filter(
            status__in=[BatchStatus.VALIDATING, BatchStatus.IN_PROGRESS, BatchStatus.CANCELLING]
        )
        .filter(
            Q(advanced_at__isnull=True, created_at__lt=now - timedelta(seconds=STALLED_AFTER_S))
            | Q(advanced_at__lt=now - timedelta(seconds=STALLED_AFTER_S))
        )
        .values_list("pk", flat=True)[:1000]
    )
