"""One error shape for every 4xx: {"error": {"code", "message", "fields": {path: [msgs]}}}."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import exception_handler

from inference.intake.admission import AdmissionRefused, counted_refusal
from inference.jobs.inputs import InputError


def _flatten(detail, prefix: str = "") -> dict[str, list[str]]:
    if isinstance(detail, dict):
        out: dict[str, list[str]] = {}
        for key, value in detail.items():
            path = key if not prefix else f"{prefix}.{key}"
            if key == "non_field_errors":
                path = prefix or "body"
            out.update(_flatten(value, path))
        return out
    if isinstance(detail, list) and detail and all(isinstance(d, dict | list) for d in detail):
        out = {}
        for i, value in enumerate(detail):
            out.update(_flatten(value, f"{prefix}[{i}]"))
        return out
    messages = detail if isinstance(detail, list) else [detail]
    return {prefix or "body": [str(m) for m in messages]}


def error_response(
    status_code: int, code: str, message: str, fields: dict | None = None, headers=None
) -> Response:
    body = {"error": {"code": code, "message": message, "fields": fields or {}}}
    return Response(body, status=status_code, headers=headers)


class ErrorDetailSerializer(serializers.Serializer):
    code = serializers.CharField()
    message = serializers.CharField()
    fields = serializers.DictField(child=serializers.ListField(child=serializers.CharField()))


class ErrorSerializer(serializers.Serializer):
    error = ErrorDetailSerializer()


# Every error the job API can answer, for the OpenAPI schema (429/503 carry Retry-After, and
# retry-after-ms when admission refused).
ERROR_RESPONSES = {
    code: OpenApiResponse(ErrorSerializer, description=description)
    for code, description in {
        400: "Invalid input or query parameter; `fields` names the offending field. "
        "`context_length_exceeded` / `no_backend_available`: no configured backend can serve "
        "the job (too large for each, or each misconfigured, e.g. an API key variable unset).",
        401: "No or invalid API key.",
        404: "No such job for this tenant.",
        409: "The job cannot be cancelled in its state.",
        413: "Request body too large.",
        415: "The body is not JSON (send Content-Type: application/json).",
        429: "Rate limit or quota exceeded (Retry-After, retry-after-ms), or too many failed "
        "API keys (Retry-After).",
        503: "Queue full, or your realtime/api jobs of the service waiting over half its "
        "queue_timeout (Retry-After, retry-after-ms); or a dependency unavailable "
        "(Retry-After).",
    }.items()
}
# What any authenticated request can get whatever it asks: no or a bad key, too many bad keys
# from this address, a dependency (PostgreSQL, Redis, RabbitMQ) down.
_ANY_REQUEST = (401, 429, 503)


def error_responses(*codes: int) -> dict[int, OpenApiResponse]:
    """The documented errors of one operation: `codes` plus those any request can get."""
    return {code: ERROR_RESPONSES[code] for code in sorted({*codes, *_ANY_REQUEST})}


def renq_exception_handler(exc, context):
    if isinstance(exc, InputError):
        return error_response(
            status.HTTP_400_BAD_REQUEST,
            # UnservableJob: context_length_exceeded or no_backend_available.
            getattr(exc, "code", "invalid_input"),
            f"{exc.field}: {exc.message}",
            {exc.field: [exc.message]},
        )
    if isinstance(exc, AdmissionRefused):
        response = error_response(
            exc.status_code,
            "rate_limited" if exc.status_code == 429 else "queue_full",
            exc.message,
            {exc.field: [exc.message]},
            headers=exc.retry_headers,
        )
        if exc.quota:
            response.data["error"]["quota"] = exc.quota
        return counted_refusal(response, exc)
    response = exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, ValidationError):
        fields = _flatten(exc.detail)
        first = next(iter(fields.items()))
        response.data = {
            "error": {
                "code": "invalid_input",
                "message": f"{first[0]}: {first[1][0]}",
                "fields": fields,
            }
        }
        return response
    detail = response.data.get("detail", "") if isinstance(response.data, dict) else ""
    code = getattr(getattr(exc, "detail", None), "code", None) or exc.__class__.__name__.lower()
    message = str(detail)
    fields = {}
    if response.status_code == 400 and "JSON parse error" in message:
        code, fields = "malformed_json", {"body": [message]}
    response.data = {"error": {"code": code, "message": message, "fields": fields}}
    return response
