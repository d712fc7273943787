"""The synchronous work behind the front door's views (run on the db.py pool): authenticate,
submit the request as a job, read it back once it is final."""

from __future__ import annotations

import uuid

from inference.dispatch.publishing import carried_text
from inference.dispatch.queues import tier_queue
from inference.intake import lookups
from inference.intake.admission import AdmissionRefused
from inference.intake.submission import submit_job
from inference.jobs.inputs import InputError
from inference.jobs.kinds import validate_input
from inference.jobs.tiers import Tier
from inference.models import TERMINAL_STATUSES, Job, Tenant
from inference.openai_api.endpoints import Endpoint, JobRequest, prepare
from inference.openai_api.errors import (
    from_admission_refused,
    from_input_error,
    invalid_api_key,
)
from routing.router import cached_route_entries

# The kinds whose requests get a head start from the event loop: a generation takes none (its
# model batches continuously), and building its prompt reads the model's chat template.
HEAD_START_KINDS = frozenset({"embedding", "reranker"})

PRIORITY_HEADER = "X-Renq-Priority"
DEADLINE_HEADER = "X-Renq-Deadline-Ms"


def bearer_key(authorization: str) -> str | None:
    """The key of `Authorization: Bearer <key>`, or None when the header names none."""
    scheme, _, key = authorization.partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


def authenticate(authorization: str) -> Tenant:
    """The tenant of `Authorization: Bearer <key>`, or a 401 in OpenAI's words."""
    key = bearer_key(authorization)
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
    it is submitted, from the event loop: a realtime job of a service with no route, whose
    key and service this process has cached. Never queries: None when anything is not
    cached, or the job would not be such a job, and the submit then offers it as for any
    job. The submit still decides everything: a pass for a job that is then refused, served
    at another tier or never committed is dropped (inference.workers.gpu.early_pass)."""
    if priority != Tier.REALTIME or endpoint.kind not in HEAD_START_KINDS:
        return None
    if not isinstance(body, dict):
        return None
    key = bearer_key(authorization)
    api_key = lookups.cached_api_key(key) if key is not None else None
    service = lookups.cached_service(body["model"]) if isinstance(body.get("model"), str) else None
    if api_key is None or api_key.expired or service is None or service.kind != endpoint.kind:
        return None
    if cached_route_entries(service.pk) != []:
        return None  # routed, or not known yet: the route may send it to a cloud API
    try:
        payload, _ = endpoint.build(body, service)
        clean = validate_input(service.kind, payload, max_items=service.max_items_per_job)
    except Exception:  # noqa: BLE001 - the submit answers a bad request, in its own words
        return None
    carried = carried_text(clean)
    return None if carried is None else (tier_queue(service.name, Tier.REALTIME), carried)


def submit(
    authorization: str,
    endpoint: Endpoint,
    body: object,
    priority: str | None,
    deadline_ms: int | None = None,
    idempotency_key: str = "",
    job_id: uuid.UUID | None = None,
    head_start_offered: bool = False,
) -> tuple[Job, JobRequest]:
    """Authenticate, translate and submit (as `job_id`, if given): one trip to the database
    thread per request. With an Idempotency-Key already sent with the same request, the job
    that request made. `head_start_offered`: the caller offered its head start already."""
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
