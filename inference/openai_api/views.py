"""Async views of the synchronous endpoints and /v1/models.

A request is authenticated and submitted as one renq job (one trip to the database pool), then
waits for the job's outcome on Redis pub/sub (inference.delivery.waiting) — no thread is held
while it waits — for the service's total_timeout, or the client's `X-Renq-Deadline-Ms` when
that is sooner. Past that the answer is 504 with the job's id, so the result can still be
fetched from /api/v1/jobs/<id>. A retry sent with the first attempt's `Idempotency-Key` waits
for (or answers with) the job that attempt made.
"""

from __future__ import annotations

import asyncio
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from functools import wraps

from django.core.exceptions import RequestDataTooBig
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt

from inference.delivery.json_response import AnswerResponse
from inference.delivery.streaming import generated_text
from inference.delivery.waiting import async_redis, new_job_id, subscribe, wait_for_final_job
from inference.dispatch.head_start import offer_in_background
from inference.intake.row_writer import wait_until_flushed
from inference.intake.submission import IDEMPOTENCY_KEY_HEADER, effective_deadline_s
from inference.jobs.tiers import TIER_NAMES, Tier
from inference.models import Job, Service, Tenant
from inference.openai_api import endpoints, jobs
from inference.openai_api.db import in_db_thread
from inference.openai_api.endpoints import ENDPOINTS, Endpoint, JobRequest
from inference.openai_api.errors import OpenAIError, bad_request, model_not_found
from renq_site import middleware

logger = logging.getLogger(__name__)

DEADLINE_HEADER = jobs.DEADLINE_HEADER
# The worker's own verdict on a job due at the deadline (its result, or "expired") is stored
# a little after it; wait that much longer so the client gets the verdict, not a 504.
VERDICT_GRACE_S = 0.25

# Postgres, Redis or RabbitMQ unavailable under a request: 503, retry later. The REST API's
# list (a connection already closed is no DatabaseError), and any database error.
DEPENDENCY_ERRORS = (DatabaseError, *middleware.DEPENDENCY_ERRORS)

View = Callable[..., Awaitable[HttpResponse]]


def openai_view(*methods: str) -> Callable[[View], View]:
    """Allowed methods, CSRF off (API keys, not cookies), errors in OpenAI's shape."""

    def decorate(view: View) -> View:
        @csrf_exempt
        @wraps(view)
        async def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            try:
                if request.method not in methods:
                    raise OpenAIError(
                        405, f"{request.method} is not allowed here.", code="method_not_allowed"
                    )
                return await view(request, *args, **kwargs)
            except OpenAIError as exc:
                return exc.response()
            except RequestDataTooBig:
                return OpenAIError(
                    413, "the request body is too large.", code="request_too_large"
                ).response()
            except DEPENDENCY_ERRORS as exc:
                logger.warning("dependency unavailable under %s: %r", request.path, exc)
                return OpenAIError(
                    503,
                    "a dependency of renq (database, broker or Redis) is unavailable; retry later.",
                    type="server_error",
                    code="service_unavailable",
                    headers={"Retry-After": str(middleware.DEPENDENCY_RETRY_AFTER_S)},
                ).response()

        return wrapper

    return decorate


def authorization(request: HttpRequest) -> str:
    return request.headers.get("Authorization", "")


async def authenticated_tenant(request: HttpRequest) -> Tenant:
    return await in_db_thread(jobs.authenticate, authorization(request))


def json_body(request: HttpRequest) -> object:
    try:
        return json.loads(request.body or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}", code="malformed_json") from None


def requested_priority(request: HttpRequest) -> str | None:
    priority = request.headers.get(jobs.PRIORITY_HEADER)
    if priority is not None and priority not in TIER_NAMES:
        raise bad_request(
            f"{jobs.PRIORITY_HEADER} must be one of {', '.join(Tier.values)}.",
            jobs.PRIORITY_HEADER,
        )
    return priority or None


def requested_deadline_ms(request: HttpRequest) -> int | None:
    """The header as an integer; submit_job checks its range and stores it on the job."""
    value = request.headers.get(DEADLINE_HEADER)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise bad_request(
            f"{DEADLINE_HEADER} must be an integer number of milliseconds.", DEADLINE_HEADER
        ) from None


def idempotency_key(request: HttpRequest) -> str:
    return request.headers.get(IDEMPOTENCY_KEY_HEADER, "")


async def submitted(
    request: HttpRequest,
    endpoint: Endpoint,
    body,
    priority: str,
    deadline_ms: int | None,
    job_id: uuid.UUID | None = None,
    caller_waits: bool = False,
) -> tuple[Job, JobRequest, float]:
    """The request's job, submitted (as `job_id`, if given; or found again by its
    Idempotency-Key), its request, and how long the request may wait for it: the client's
    deadline, never past the service's. A job of `job_id` that can be offered a head start
    from here is offered one first, while the submit is on its way to the database thread.
    `caller_waits`: the request answers with the job's outcome (its commit may skip the WAL
    flush: see submission.JobRequest.caller_waits)."""
    offered = False
    if job_id is not None and not idempotency_key(request):  # a key may find an older job
        target = jobs.head_start_target(authorization(request), endpoint, body, priority)
        if target is not None:
            queue, carried = target
            offer_in_background(async_redis(), queue, str(job_id), carried)
            # The offer goes out first: once on its thread, the submission would hold the GIL
            # until its own first round trip.
            await asyncio.sleep(0)
            offered = True
    job, job_request = await in_db_thread(
        jobs.submit,
        authorization(request),
        endpoint,
        body,
        priority,
        deadline_ms,
        idempotency_key(request),
        job_id,
        offered,
        caller_waits,
    )
    return job, job_request, effective_deadline_s(job_request.service, deadline_ms)


async def submitted_and_final(
    request: HttpRequest, endpoint: Endpoint, body, priority: str, deadline_ms: int | None
) -> tuple[Job, JobRequest, float, Job | None]:
    """Submit the request's job and wait for it: (job, request, wait bound, the final job or
    None past the bound). The job's id is chosen here and its notification subscribed to
    before it is submitted, so its outcome arrives with the notification: no read of the row
    before or after."""
    job_id = new_job_id()
    subscription = await subscribe(job_id)
    try:
        job, job_request, timeout_s = await submitted(
            request, endpoint, body, priority, deadline_ms, job_id, caller_waits=True
        )
    except BaseException:
        await subscription.close()
        raise
    if job.pk != job_id or job.is_terminal:
        # Another request's job (its Idempotency-Key), or answered from the result cache.
        await subscription.close()
        subscription = None
    final = await wait_for_final_job(
        job.pk,
        lambda: in_db_thread(jobs.read_final_job, job.pk),
        timeout_s=timeout_s + VERDICT_GRACE_S,
        subscription=subscription,
        from_notice=lambda notice: notice.final_job(job),
    )
    return job, job_request, timeout_s, final


async def answer_with_job(request: HttpRequest, endpoint: Endpoint) -> HttpResponse:
    """Submit the request as a job, wait for it, answer as OpenAI would."""
    priority = requested_priority(request)
    deadline_ms = requested_deadline_ms(request)
    body = json_body(request)
    if isinstance(body, dict) and body.get("stream") not in (None, False):
        if body["stream"] is not True:
            raise bad_request("stream must be true or false.", "stream")
        if endpoint.kind != "llm":
            raise bad_request(f"{endpoint.path} does not stream.", "stream")
        return await stream_answer(request, endpoint, body, priority, deadline_ms)
    job, job_request, timeout_s, final = await submitted_and_final(
        request, endpoint, body, priority, deadline_ms
    )
    if final is None:
        if deadline_ms is not None and deadline_ms / 1000 <= timeout_s:
            # The client's own deadline passed: a job nobody started would only waste a GPU.
            # Past total_timeout alone the job runs on, its result kept for a later fetch.
            await in_db_thread(jobs.cancel_if_queued, job.pk)
        # The answer names a job to fetch later: its row is on disk first.
        await in_db_thread(wait_until_flushed)
        raise OpenAIError(
            504,
            f"job {job.pk} did not finish within {timeout_s:g} s; fetch its result later from "
            f"/api/v1/jobs/{job.pk}.",
            type="timeout",
            code="job_timeout",
            headers={"X-Renq-Job-Id": str(job.pk)},
        )
    headers = jobs.renq_headers(final)
    if final.status != "succeeded":
        error = endpoints.job_failure(final)
        error.headers.update(headers)
        raise error
    try:
        answer = endpoint.render(final, job_request.options)
    except OpenAIError as exc:
        exc.headers.update(headers)
        raise
    response = AnswerResponse(answer)  # a list for TEI's rerank
    for name, value in headers.items():
        response[name] = value
    return response


async def stream_answer(
    request: HttpRequest, endpoint: Endpoint, body: dict, priority, deadline_ms
) -> StreamingHttpResponse:
    """Server-Sent Events: `chat.completion.chunk` (or `text_completion`) chunks with the text
    as the worker generates it, then the finish reason, the usage when
    `stream_options.include_usage` asks for it, and `[DONE]`. Errors before the first byte are
    ordinary OpenAI errors; after it, an `error` event."""
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad_request("stream_options must be an object.", "stream_options")
    include_usage = bool(options.get("include_usage"))
    job, job_request, timeout_s = await submitted(request, endpoint, body, priority, deadline_ms)
    chat = endpoint.path == endpoints.CHAT_COMPLETIONS
    stop = job_request.options.get("stop", [])

    def chunk(text: str | None = None, finish_reason: str | None = None, usage=None) -> bytes:
        if chat:
            delta = {"role": "assistant", "content": text} if text is not None else {}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            kind = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None,
                      "finish_reason": finish_reason}  # fmt: skip
            kind = "text_completion"
        payload = {
            "id": f"{'chatcmpl' if chat else 'cmpl'}-{job.pk}",
            "object": kind,
            "created": int(job.created_at.timestamp()),
            "model": job_request.service.name,
            "choices": [choice] if usage is None else [],
        }
        if include_usage:
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n".encode()

    async def events():
        generated = ""  # everything the worker has sent
        sent = ""  # what the client has been sent (stop sequences applied)
        # A stop sequence may arrive in pieces: hold back its length minus one character.
        hold = max((len(s) for s in stop), default=1) - 1

        async def is_final() -> bool:
            return await in_db_thread(jobs.read_final_job, job.pk) is not None

        async for piece in generated_text(job.pk, is_final, timeout_s=timeout_s):
            generated += piece
            text, _ = endpoints.apply_stop(generated, "stop", stop)
            ready = text if len(text) < len(generated) else text[: len(text) - hold]
            if len(ready) > len(sent):
                yield chunk(ready[len(sent) :])
                sent = ready
        final = await in_db_thread(jobs.read_final_job, job.pk)
        if final is None or final.status != "succeeded":
            reason = "did not finish in time" if final is None else (final.error or final.status)
            error = {"message": f"job {job.pk}: {reason}", "type": "server_error",
                     "param": None, "code": "job_failed"}  # fmt: skip
            yield f"data: {json.dumps({'error': error})}\n\n".encode()
            yield b"data: [DONE]\n\n"
            return
        text, finish_reason = endpoints.apply_stop(
            final.result["text"], final.result.get("finish_reason", "stop"), stop
        )
        if len(text) > len(sent) and text.startswith(sent):
            yield chunk(text[len(sent) :])
        yield chunk(finish_reason=finish_reason)
        if include_usage:
            yield chunk(usage=endpoints.completion_usage(final))
        yield b"data: [DONE]\n\n"

    response = StreamingHttpResponse(events(), content_type="text/event-stream")
    response["Cache-Control"] = "no-cache"
    response["X-Renq-Job-Id"] = str(job.pk)
    return response


def answering(path: str) -> View:
    """The view of one job endpoint (ENDPOINTS[path]): submit, wait, answer."""

    async def view(request: HttpRequest) -> HttpResponse:
        return await answer_with_job(request, ENDPOINTS[path])

    view.__name__ = view.__qualname__ = path.strip("/").replace("/", "_")
    return openai_view("POST")(view)


embeddings = answering(endpoints.EMBEDDINGS)
embed = answering(endpoints.EMBED)
embed_v2 = answering(endpoints.EMBED_V2)
rerank = answering(endpoints.RERANK)
rerank_v2 = answering(endpoints.RERANK_V2)
tei_rerank = answering(endpoints.TEI_RERANK)
chat_completions = answering(endpoints.CHAT_COMPLETIONS)
completions = answering(endpoints.COMPLETIONS)


def _model(service: Service) -> dict:
    return {"id": service.name, "object": "model", "created": 0, "owned_by": "renq"}


def _list_models(authorization_header: str) -> list[dict]:
    jobs.authenticate(authorization_header)
    return [_model(service) for service in Service.objects.filter(active=True)]


def _get_model(authorization_header: str, model: str) -> dict:
    jobs.authenticate(authorization_header)
    service = Service.objects.filter(name=model, active=True).first()
    if service is None:
        raise model_not_found(model)
    return _model(service)


@openai_view("GET")
async def models(request: HttpRequest) -> HttpResponse:
    data = await in_db_thread(_list_models, authorization(request))
    return JsonResponse({"object": "list", "data": data})


@openai_view("GET")
async def model_detail(request: HttpRequest, model: str) -> HttpResponse:
    return JsonResponse(await in_db_thread(_get_model, authorization(request), model))
