"""The synchronous work behind the front door's views (run on the db.py pool): authenticate,
submit the request as a job, read it back once it is final."""

from __future__ import annotations

import uuid

from inference.intake import lookups
from inference.intake.admission import AdmissionRefused
from inference.intake.head_start_target import HEAD_START_KINDS
from inference.intake.head_start_target import head_start_target as cached_head_start_target
from inference.intake.submission import submit_job
from inference.jobs.inputs import InputError
from inference.jobs.tiers import Tier
from inference.models import TERMINAL_STATUSES, Job, Tenant
from inference.openai_api.endpoints import Endpoint, JobRequest, prepare
from inference.openai_api.errors import (
    from_admission_refused,
    from_input_error,
    invalid_api_key,
)

PRIORITY_HEADER = "X-Renq-Priority"
DEADLINE_HEADER = "X-Renq-Deadline-Ms"


def authenticate(authorization: str) -> Tenant:
    """The tenant of `Authorization: Bearer <key>`, or a 401 in OpenAI's words."""
    key = lookups.bearer_key(authorization)
    if key is None:
        raise invalid_api_key(
            "You didn't provide an API key. Send it as 'Authorization: Bearer <api key>'."
        )
    api_key = lookups.api_key(key)
    if api_key is None or api_key.expired:
        raise invalid_api_key("Incorrect API key provided.")
    return api_key.tenant


def head_start_target(
    authorization: str, endpoint: Endpoint, body: object, priority: str | None
) -> tuple[str, str] | None:
    """The queue and the input (JSON) to offer an idle worker for this request's job before
    it is submitted (inference.intake.head_start_target), or None."""
    if priority != Tier.REALTIME or endpoint.kind not in HEAD_START_KINDS:
        return None
    if not isinstance(body, dict):
        return None

    def payload(service):
        if service.kind != endpoint.kind:
            raise ValueError(f"{service.name} is not a {endpoint.kind} service")
        return endpoint.build(body, service)[0]

    return cached_head_start_target(authorization, body.get("model"), payload)


def submit(
    authorization: str,
    endpoint: Endpoint,
    body: object,
    priority: str | None,
    deadline_ms: int | None = None,
    idempotency_key: str = "",
    job_id: uuid.UUID | None = None,
    head_start_offered: bool = False,
    caller_waits: bool = False,
) -> tuple[Job, JobRequest]:
    """Authenticate, translate and submit (as `job_id`, if given): one trip to the database
    thread per request. With an Idempotency-Key already sent with the same request, the job
    that request made. `head_start_offered`: the caller offered its head start already;
    `caller_waits`: it answers with the job's outcome (submission.JobRequest.caller_waits)."""
    tenant = authenticate(authorization)
    request = prepare(endpoint, body)
    if isinstance(body, dict) and body.get("stream") is True:
        # The worker publishes the text as it generates it (inference.delivery.streaming).
        request.payload["stream"] = True
    try:
        job = submit_job(
            tenant=tenant,
            service_name=request.service.name,
            payload=request.payload,
            priority=priority,
            deadline_ms=deadline_ms,
            idempotency_key=idempotency_key,
            job_id=job_id,
            head_start_offered=head_start_offered,
            caller_waits=caller_waits,
        )
    except InputError as exc:
        headers = {"priority": PRIORITY_HEADER, "deadline_ms": DEADLINE_HEADER}
        raise from_input_error(exc, {**endpoint.field_names, **headers}) from exc
    except AdmissionRefused as exc:
        raise from_admission_refused(exc) from exc
    return job, request


def read_final_job(job_id: uuid.UUID) -> Job | None:
    """The job with what its answer needs, if it reached a final status; else None."""
    return (
        Job.objects.filter(pk=job_id, status__in=TERMINAL_STATUSES)
        .select_related("service", "route__backend")
        .first()
    )


def cancel_if_queued(job_id: uuid.UUID) -> None:
    """The client's deadline passed: a job nobody started yet would only waste a GPU."""
    Job.objects.filter(pk=job_id).cancel()


def renq_headers(job: Job) -> dict[str, str]:
    headers = {"X-Renq-Job-Id": str(job.pk)}
    if job.is_terminal:
        if hasattr(job, "noticed_backend"):
            name = job.noticed_backend  # as its notification said (finished_as_noticed)
        else:
            backend = job.current_backend()
            name = backend.name if backend is not None else None
        headers["X-Renq-Backend"] = name or "local"
        if job.queue_wait_ms is not None:
            headers["X-Renq-Queue-Wait-Ms"] = f"{job.queue_wait_ms:.1f}"
    return headers
