"""Answers every client with a status it can act on, never a closed connection or a 500 page.

- `RequestBodyLimitMiddleware`: a body larger than RENQ_MAX_REQUEST_BYTES gets 413 at once,
  before anything reads it.
- `DependencyUnavailableMiddleware`: PostgreSQL, Redis or RabbitMQ failing under a request
  (down, restarting, out of connections) is a 503 with Retry-After, not Django's HTML 500.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
from amqp.exceptions import AMQPError
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from kombu.exceptions import OperationalError as BrokerOperationalError

logger = logging.getLogger(__name__)

# Errors that say a dependency is unavailable, not that the request is wrong.
DEPENDENCY_ERRORS: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    redis.ConnectionError,
    redis.TimeoutError,
    BrokerOperationalError,
    AMQPError,
    ConnectionError,
)
DEPENDENCY_RETRY_AFTER_S = 5


def error_body(code: str, message: str, field: str = "body") -> dict:
    return {"error": {"code": code, "message": message, "fields": {field: [message]}}}


def dependency_unavailable(exc: BaseException) -> JsonResponse:
    logger.warning("dependency unavailable: %s: %s", type(exc).__name__, exc)
    response = JsonResponse(
        error_body(
            "service_unavailable",
            "a dependency of renq (database, broker or Redis) is unavailable; retry later.",
        ),
        status=503,
    )
    response["Retry-After"] = str(DEPENDENCY_RETRY_AFTER_S)
    return response


def body_too_large(limit: int) -> JsonResponse:
    return JsonResponse(
        error_body(
            "request_too_large",
            f"the request body is larger than {limit} bytes (RENQ_MAX_REQUEST_BYTES).",
        ),
        status=413,
    )


class RequestBodyLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        limit = settings.RENQ_MAX_REQUEST_BYTES
        try:
            length = int(request.META.get("CONTENT_LENGTH") or 0)
        except ValueError:
            length = 0
        if length > limit:
            return body_too_large(limit)
        return self.get_response(request)


class DependencyUnavailableMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        try:
            return self.get_response(request)
        except DEPENDENCY_ERRORS as exc:
            # Raised outside a view's own handler (e.g. by the session middleware).
            return dependency_unavailable(exc)

    def process_exception(self, request: HttpRequest, exc: Exception) -> HttpResponse | None:
        if isinstance(exc, RequestDataTooBig):
            return body_too_large(settings.RENQ_MAX_REQUEST_BYTES)
        if isinstance(exc, DEPENDENCY_ERRORS):
            return dependency_unavailable(exc)
        return None
