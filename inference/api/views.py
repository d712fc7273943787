from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db.models import Prefetch
from django.http import HttpResponseBase
from django.shortcuts import get_object_or_404
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, extend_schema
from rest_framework import generics, status
from rest_framework.exceptions import NotFound
from rest_framework.parsers import JSONParser
from rest_framework.response import Response
from rest_framework.views import APIView

from inference.api import schema as _schema  # noqa: F401 - registers the API key scheme
from inference.api.errors import error_response, error_responses
from inference.api.head_start import offered_job_id
from inference.api.intake import job_fields, requested_actor
from inference.api.query import NamedQueryParameters
from inference.api.serializers import (
    BatchJobsSerializer,
    BulkJobSubmitSerializer,
    JobAcceptedSerializer,
    JobResultSerializer,
    JobSerializer,
    JobSubmitSerializer,
    JobSummarySerializer,
    ServiceSerializer,
    accepted_job_body,
    waited_job_body,
)
from inference.delivery.json_response import AnswerResponse
from inference.delivery.waiting import (
    answered_job,
    answered_jobs,
    kept_answers,
    new_job_id,
    subscribe,
    wait_for_any_final,
    wait_for_final_job,
    wait_synchronously,
)
from inference.dispatch.queue_report import queue_report
from inference.intake.bulk import bulk_progresses, submit_bulk
from inference.intake.row_writer import wait_until_flushed
from inference.intake.submission import (
    IDEMPOTENCY_KEY_HEADER,
    MAX_JOBS_PER_REQUEST,
    JobRequest,
    cancel_job,
    prepare,
    submit_job,
    submit_jobs,
)
from inference.jobs.inputs import InputError, check_storable_text
from inference.jobs.vectors import ENCODING_FORMATS
from inference.models import TERMINAL_STATUSES, Job, JobStatus, Service
from renq_site.request_lanes import DeferredResponse
from routing.models import JobAttempt

IDEMPOTENCY_KEY_DOC = (
    "An `Idempotency-Key` header makes a retry safe: the same request sent again with it "
    "(24 h) is answered 200 with what the first made, and makes nothing; the key sent with "
    "a different request is a 400 naming it."
)

# Request examples for the docs page (and the first cases schemathesis sends).
SUBMIT_EXAMPLES = [
    OpenApiExample(
        "embedding",
        {"service": "embedding", "priority": "realtime", "input": {"texts": ["hello world"]}},
        request_only=True,
    ),
    OpenApiExample(
        "reranker",
        {"service": "reranker", "input": {"query": "cats", "documents": ["a cat", "tax"]}},
        request_only=True,
    ),
    OpenApiExample(
        "llm",
        {"service": "llm", "input": {"prompt": "Say hi", "max_tokens": 8}},
        request_only=True,
    ),
]


# The longest a POST may wait for its job (?wait=): a long poll, not a connection held open.
MAX_WAIT_S = 60
WAIT_PARAMETER = OpenApiParameter(
    "wait",
    type=float,
    description="Wait up to this many seconds (at most 60) for the job to be final: 200 with "
    "its result when it is, else 202 as without a wait. One job per POST.",
)

READ_WAIT_PARAMETER = OpenApiParameter(
    "wait",
    type={"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": MAX_WAIT_S},
    description="Wait up to this many seconds (at most 60) for the job to be final, then "
    "answer with the job as it is then: a long poll, in place of polling.",
)


ENCODING_FORMAT_PARAMETER = OpenApiParameter(
    "encoding_format",
    enum=list(ENCODING_FORMATS),
    description="How an embedding result's vectors are written: `float` lists (the default) "
    "or `base64`, one string per vector of little-endian float32 values (OpenAI's name and "
    "format).",
)


def requested_wait(request) -> float | None:
    """`?wait=<seconds>`: how long a request may wait for its job to be final (None: not at
    all); another value is a 400 naming it."""
    value = request.query_params.get("wait")
    if value is None:
        return None
    try:
        wait_s = float(value)
    except ValueError:
        wait_s = -1.0
    if not 0 < wait_s <= MAX_WAIT_S:
        raise InputError("wait", f"must be a number of seconds above 0 and at most {MAX_WAIT_S}.")
    return wait_s


def requested_encoding(request) -> dict:
    """The serializer context for `?encoding_format=`; another value is a 400 naming it."""
    encoding_format = request.query_params.get("encoding_format", "float")
    if encoding_format not in ENCODING_FORMATS:
        raise InputError("encoding_format", f"must be one of {', '.join(ENCODING_FORMATS)}.")
    return {"encoding_format": encoding_format}


def _waiting_response(request, answer: Callable[[], Awaitable[HttpResponseBase]]):
    """A view's answer that waits for jobs: made on the event loop under the ASGI server, so no
    request thread is held while it waits (DeferredResponse); from synchronous code (WSGI, the
    test client), on a loop of its own."""
    if isinstance(request._request, ASGIRequest):
        return DeferredResponse(answer)
    return wait_synchronously(answer)


class JobListCreateView(NamedQueryParameters, generics.ListAPIView):
    query_parameters = {
        "GET": frozenset({"status", "service", "limit", "offset"}),
        "POST": frozenset({"wait", "encoding_format"}),
    }
    serializer_class = JobSummarySerializer
    _bulk_progress: dict = {}  # the page's bulk jobs' progress (paginate_queryset)
    # Jobs are JSON (a form field cannot carry an input object): anything else is a 415.
    parser_classes = [JSONParser]

    def get_queryset(self):
        # Pieces of bulk jobs are internal; their parent reports progress.
        # The list shows no result: its bodies (vectors above all) are not even read.
        jobs = (
            Job.objects.filter(tenant=self.request.user, parent__isnull=True)
            .select_related("service", "route__backend")
            .defer("result", "result_vectors")
        )
        status_filter = self.request.query_params.get("status")
        if status_filter is not None:  # `status=` is not "any status": it is no status at all
            if status_filter not in JobStatus.values:
                raise InputError("status", f"must be one of {', '.join(JobStatus.values)}.")
            jobs = jobs.filter(status=status_filter)
        service = self.request.query_params.get("service")
        if service:
            check_storable_text(service, "service")  # a NUL cannot be sent in a query
            jobs = jobs.filter(service__name=service)
        return jobs

    @extend_schema(
        parameters=[
            OpenApiParameter("status", enum=JobStatus.values, description="Only jobs in it."),
            OpenApiParameter("service", str, description="Only jobs of this service."),
        ],
        responses={200: JobSummarySerializer(many=True), **error_responses(400)},
    )
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)

    def paginate_queryset(self, queryset):
        # A page reads as each job's own page does: answered before its store, a job shows
        # its answer. The `status` filter is on the stored status.
        page = super().paginate_queryset(queryset)
        if page is None:
            return None
        self._bulk_progress = bulk_progresses(page)
        return answered_jobs(page)

    def get_serializer_context(self) -> dict:
        return {**super().get_serializer_context(), "bulk_progress": self._bulk_progress}

    @extend_schema(
        request=JobSubmitSerializer,
        parameters=[ENCODING_FORMAT_PARAMETER, WAIT_PARAMETER],
        responses={
            202: JobAcceptedSerializer,
            200: JobAcceptedSerializer,
            **error_responses(400, 413, 415),
        },
        examples=SUBMIT_EXAMPLES,
        description="Submit one job (an object) or many (a list of up to "
        f"{MAX_JOBS_PER_REQUEST} objects: one transaction, per-item results and errors). "
        + IDEMPOTENCY_KEY_DOC,
    )
    def post(self, request):
        # A cache hit answers with its result: encoded as asked, checked before any job exists.
        context = requested_encoding(request)
        wait_s = requested_wait(request)
        if isinstance(request.data, list):
            if wait_s is not None:
                raise InputError("wait", "applies to one job, not to a list of jobs.")
            return self._post_many(request, context)
        fields = job_fields(request.data)
        if wait_s is not None:
            return self._post_and_wait(request, fields, context["encoding_format"], wait_s)
        job = self._submit_one(request, fields)
        replayed = getattr(job, "replayed", False)
        return Response(
            accepted_job_body(job, context["encoding_format"]),
            status=status.HTTP_200_OK if replayed else status.HTTP_202_ACCEPTED,
        )

    def _submit_one(
        self,
        request,
        fields: dict,
        job_id: uuid.UUID | None = None,
        head_start_offered: bool = False,
        caller_waits: bool = False,
    ) -> Job:
        return submit_job(
            tenant=request.user,
            service_name=fields.get("service"),
            payload=fields["input"],
            priority=fields.get("priority"),
            deadline_ms=fields.get("deadline_ms"),
            idempotency_key=request.headers.get(IDEMPOTENCY_KEY_HEADER, ""),
            actor=requested_actor(request),
            job_id=job_id,
            head_start_offered=head_start_offered,
            caller_waits=caller_waits,
        )

    def _post_and_wait(self, request, fields: dict, encoding_format: str, wait_s: float):
        """Submit, then answer once the job is final (200 with its result) or `wait_s` passed
        (202, as without a wait). Under the ASGI server the wait is the event loop's
        (DeferredResponse): the process hears the notifications of the jobs it submits under
        ids of `new_job_id` from the moment they exist, and one brings the outcome, so nothing
        is read back and no request thread is held."""
        offered = offered_job_id(request._request)  # its head start is under way
        job_id = offered or new_job_id()
        submitted_at = time.monotonic()
        job = self._submit_one(
            request, fields, job_id, head_start_offered=offered is not None, caller_waits=True
        )
        # Not another request's job (its Idempotency-Key), nor answered from the result cache.
        own = job.pk == job_id and not job.is_terminal

        async def answer() -> AnswerResponse:
            # Heard since before the submit (the process listens to its jobs' ids), or read
            # first once subscribed.
            subscription = await subscribe(job.pk, since=submitted_at) if own else None
            final = await wait_for_final_job(
                job.pk,
                # Rare (a failure, a large result, a lost notification): on the request's
                # lane, as its other queries.
                lambda: sync_to_async(_final_job, thread_sensitive=True)(job.pk),
                timeout_s=wait_s,
                subscription=subscription,
                from_notice=lambda notice: notice.final_job(job),
            )
            if final is None:
                # A 202 says the job was accepted: its row is on disk first (its commit did
                # not wait for the WAL flush, the caller was waiting).
                await sync_to_async(wait_until_flushed, thread_sensitive=True)()
            return AnswerResponse(
                waited_job_body(final or job, encoding_format), status=200 if final else 202
            )

        return _waiting_response(request, answer)

    def _post_many(self, request, context: dict):
        items = request.data
        if not items or len(items) > MAX_JOBS_PER_REQUEST:
            raise InputError("body", f"must list 1 to {MAX_JOBS_PER_REQUEST} jobs.")
        tenant = request.user
        results: list[dict | None] = [None] * len(items)
        valid: list[tuple[int, JobRequest]] = []
        for i, item in enumerate(items):
            try:
                fields = job_fields(item, prefix=f"[{i}].")
                valid.append(
                    (
                        i,
                        prepare(
                            tenant,
                            service_name=fields.get("service"),
                            payload=fields["input"],
                            priority=fields.get("priority"),
                            deadline_ms=fields.get("deadline_ms"),
                        ),
                    )
                )
            except InputError as exc:
                field = exc.field if exc.field.startswith("[") else f"[{i}].{exc.field}"
                results[i] = {
                    "error": {
                        # UnservableJob's code says no configured backend can serve it.
                        "code": getattr(exc, "code", "invalid_input"),
                        "field": field,
                        "message": f"{field}: {exc.message}",
                    }
                }
        if not valid:
            first = next(r for r in results if r)["error"]
            raise InputError(first["field"], first["message"].split(": ", 1)[-1])
        jobs = submit_jobs(
            tenant,
            [r for _, r in valid],
            idempotency_key=request.headers.get(IDEMPOTENCY_KEY_HEADER, ""),
            actor=requested_actor(request),
        )
        for (i, _), job in zip(valid, jobs, strict=True):
            results[i] = accepted_job_body(job, context["encoding_format"])
        replayed = all(getattr(job, "replayed", False) for job in jobs)
        return Response(
            {"accepted": len(valid), "rejected": len(items) - len(valid), "jobs": results},
            status=status.HTTP_200_OK if replayed else status.HTTP_202_ACCEPTED,
        )


class BulkJobCreateView(NamedQueryParameters, APIView):
    parser_classes = [JSONParser]

    @extend_schema(
        request=BulkJobSubmitSerializer,
        responses={202: JobSerializer, 200: JobSerializer, **error_responses(400, 413, 415)},
        description=IDEMPOTENCY_KEY_DOC,
        examples=[
            OpenApiExample(
                "embedding texts in bulk",
                {"service": "embedding", "priority": "batch", "input": {"texts": ["t1", "t2"]}},
                request_only=True,
            )
        ],
    )
    def post(self, request):
        fields = job_fields(request.data)
        if "deadline_ms" in fields:
            raise InputError("deadline_ms", "is not supported on bulk jobs.")
        job = submit_bulk(
            tenant=request.user,
            service_name=fields.get("service"),
            payload=fields["input"],
            priority=fields.get("priority"),
            idempotency_key=request.headers.get(IDEMPOTENCY_KEY_HEADER, ""),
            actor=requested_actor(request),
        )
        replayed = getattr(job, "replayed", False)
        return Response(
            JobSerializer(job).data,
            status=status.HTTP_200_OK if replayed else status.HTTP_202_ACCEPTED,
        )


def _final_job(job_id) -> Job | None:
    return (
        Job.objects.filter(pk=job_id, status__in=TERMINAL_STATUSES)
        .select_related("service", "route__backend")
        .first()
    )


def _own_jobs(request):
    # Another tenant's job is indistinguishable from a missing one: 404, never 403.
    return Job.objects.select_related("service", "route__backend").filter(tenant=request.user)


def _read_job(request, job_id) -> Job:
    """The tenant's job as a read shows it (answered_job), with what its page lists; 404 when
    it has no such job."""
    attempts = Prefetch(
        "routing_attempts",
        queryset=JobAttempt.objects.select_related("backend").order_by("started_at", "id"),
    )
    return answered_job(get_object_or_404(_own_jobs(request).prefetch_related(attempts), pk=job_id))


def _job_page(request, job_id, context: dict) -> dict:
    return JobSerializer(_read_job(request, job_id), context=context).data


class JobDetailView(NamedQueryParameters, APIView):
    query_parameters = {"GET": frozenset({"encoding_format", "wait"})}

    @extend_schema(
        parameters=[ENCODING_FORMAT_PARAMETER, READ_WAIT_PARAMETER],
        responses={200: JobSerializer, **error_responses(400, 404)},
    )
    def get(self, request, job_id):
        context = requested_encoding(request)
        wait_s = requested_wait(request)
        job = _read_job(request, job_id)
        if wait_s is None or job.is_terminal:
            return Response(JobSerializer(job, context=context).data)

        async def answer() -> AnswerResponse:
            # Any notice (or a read that finds it final) ends the wait; the page is then read
            # as without one, so it is the same page either way.
            await wait_for_final_job(
                job_id,
                lambda: sync_to_async(_final_job, thread_sensitive=True)(job_id),
                timeout_s=wait_s,
                from_notice=lambda notice: notice,
            )
            read = sync_to_async(_job_page, thread_sensitive=True)
            return AnswerResponse(await read(request, job_id, context))

        return _waiting_response(request, answer)

    @extend_schema(
        summary="Cancel a job (the same as POST /jobs/{job_id}/cancel)",
        description=(
            "Cancels the job, kept for clients written against it: the job is not deleted. "
            "It stays readable with status `cancelled`, and the answer is the job, as "
            "POST /jobs/{job_id}/cancel gives it."
        ),
        responses={200: JobSerializer, **error_responses(400, 404, 409)},
    )
    def delete(self, request, job_id):
        return cancel_response(request, job_id)


# The most jobs one batch read names: a hundred ids are a 4 KB query string.
MAX_BATCH_GET_IDS = 100


def requested_job_ids(request) -> list[uuid.UUID]:
    """`?id=<job id>&id=…`: the jobs a batch read names, in order (a repeated id once)."""
    values = request.query_params.getlist("id")
    if not values:
        raise InputError("id", "name at least one job: ?id=<job id>&id=<job id>.")
    if len(values) > MAX_BATCH_GET_IDS:
        raise InputError("id", f"names {len(values)} jobs; at most {MAX_BATCH_GET_IDS} per read.")
    ids = []
    for value in values:
        try:
            ids.append(uuid.UUID(value))
        except ValueError:
            raise InputError("id", f"{value[:40]!r} is not a job id (a UUID).") from None
    return list(dict.fromkeys(ids))


def _jobs_page(request, job_ids: list[uuid.UUID], context: dict) -> dict:
    """The tenant's jobs, in the order named, each as a read shows it (answered_jobs); 404
    naming an id the tenant has no job of."""
    found = {job.pk: job for job in _own_jobs(request).filter(pk__in=job_ids)}
    missing = [job_id for job_id in job_ids if job_id not in found]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise NotFound(f"no job {missing[0]}{more}")
    named = answered_jobs([found[job_id] for job_id in job_ids])
    context = {**context, "bulk_progress": bulk_progresses(named)}
    return {"jobs": JobResultSerializer(named, many=True, context=context).data}


def _any_final(request, job_ids: list[uuid.UUID]) -> bool:
    """Whether one of the tenant's jobs is final, or answered before its store."""
    statuses = Job.objects.filter(tenant=request.user, pk__in=job_ids).values_list("pk", "status")
    running = []
    for job_id, job_status in statuses:
        if job_status in TERMINAL_STATUSES:
            return True
        if job_status == JobStatus.RUNNING:
            running.append(job_id)
    return bool(running) and bool(kept_answers(running))


class JobBatchGetView(NamedQueryParameters, APIView):
    """Many jobs in one read: what a client waiting for a list of jobs asks, instead of one
    GET per job per round."""

    query_parameters = {"GET": frozenset({"id", "encoding_format", "wait"})}

    @extend_schema(
        summary="Read many jobs",
        operation_id="v1_jobs_batch_get",
        description=(
            f"Up to {MAX_BATCH_GET_IDS} of your jobs by id (`?id=<job id>&id=<job id>`), in "
            "the order named (a repeated id once), each as its own page shows it but without "
            "`wait` and `backend_attempts`. An id you have no job of is a 404 naming it. "
            "With `wait`, the read answers once one of the named jobs that was not "
            "final is, or when the wait runs out: a long poll for the next job of a list to "
            "finish, in place of a GET per job per round."
        ),
        parameters=[
            OpenApiParameter(
                "id",
                {
                    "type": "array",
                    "items": {"type": "string", "format": "uuid"},
                    "minItems": 1,
                    "maxItems": MAX_BATCH_GET_IDS,
                },
                required=True,
                explode=True,
                description="A job id; repeat it for each job.",
            ),
            ENCODING_FORMAT_PARAMETER,
            OpenApiParameter(
                "wait",
                type=READ_WAIT_PARAMETER.type,
                description="Wait up to this many seconds (at most 60) for one of the named jobs "
                "that is not final to be, then answer with them all as they are then.",
            ),
        ],
        responses={200: BatchJobsSerializer, **error_responses(400, 404)},
    )
    def get(self, request):
        context = requested_encoding(request)
        wait_s = requested_wait(request)
        job_ids = requested_job_ids(request)
        page = _jobs_page(request, job_ids, context)
        pending = [job["id"] for job in page["jobs"] if job["status"] not in TERMINAL_STATUSES]
        if wait_s is None or not pending:
            return Response(page)

        async def answer() -> AnswerResponse:
            await wait_for_any_final(
                pending,
                lambda: sync_to_async(_any_final, thread_sensitive=True)(request, pending),
                timeout_s=wait_s,
            )
            read = sync_to_async(_jobs_page, thread_sensitive=True)
            return AnswerResponse(await read(request, job_ids, context))

        return _waiting_response(request, answer)


class JobCancelView(NamedQueryParameters, APIView):
    @extend_schema(
        operation_id="jobs_cancel",
        summary="Cancel a job",
        description=(
            "Cancels a queued job (a bulk job: its queued pieces) and answers with the job, "
            "now `cancelled`, as OpenAI's POST /v1/batches/{batch_id}/cancel does. A job a "
            "worker already started or finished cannot be cancelled (409). Nothing is deleted."
        ),
        request=None,
        responses={200: JobSerializer, **error_responses(400, 404, 409)},
    )
    def post(self, request, job_id):
        return cancel_response(request, job_id)


def cancel_response(request, job_id) -> Response:
    """Cancel the tenant's job: the job (200), or 409 naming its status."""
    job = get_object_or_404(_own_jobs(request), pk=job_id)
    if not cancel_job(job, actor=requested_actor(request)):
        return error_response(
            status.HTTP_409_CONFLICT,
            "not_cancellable",
            f"job is {job.status}; only queued jobs (and running bulk jobs) can be cancelled.",
            {"status": [job.status]},
        )
    return Response(JobSerializer(job).data)


class ServiceListView(NamedQueryParameters, generics.ListAPIView):
    query_parameters = {"GET": frozenset({"limit", "offset"})}
    serializer_class = ServiceSerializer
    queryset = Service.objects.filter(active=True)

    @extend_schema(responses={200: ServiceSerializer(many=True), **error_responses(400)})
    def get(self, request, *args, **kwargs):
        return super().get(request, *args, **kwargs)


class QueueReportView(NamedQueryParameters, APIView):
    """Per service and tier: depth, oldest wait, completions in the last minute, and the batch
    cost model with its preemption budget."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT, **error_responses(400, 401)})
    def get(self, request):
        return Response({"services": queue_report()})
