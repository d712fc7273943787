"""Errors in OpenAI's shape: `{"error": {"message", "type", "param", "code"}}`.

renq's own errors (InputError, AdmissionRefused) are translated here and nowhere else, so the
`openai` SDK raises the exception class its users already catch (BadRequestError,
AuthenticationError, NotFoundError, RateLimitError, ...).
"""

from __future__ import annotations

from collections.abc import Mapping

from django.http import JsonResponse

from inference.intake.admission import AdmissionRefused, counted_refusal
from inference.jobs.inputs import InputError, UnservableJob


class OpenAIError(Exception):
    """An answer other than 2xx. `headers` go out with it (Retry-After, X-Renq-Job-Id)."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: Mapping[str, str] | None = None,
        refused: AdmissionRefused | None = None,
    ):
        super().__init__(message)
        self.refused = refused  # the admission refusal it answers
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JsonResponse:
        response = JsonResponse(self.body(), status=self.status)
        for name, value in self.headers.items():
            response[name] = value
        return response if self.refused is None else counted_refusal(response, self.refused)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param, code=code)


def model_not_found(model: str) -> OpenAIError:
    return OpenAIError(
        404,
        f"The model '{model}' does not exist or you do not have access to it.",
        param="model",
        code="model_not_found",
    )


def not_found(what: str, object_id: str) -> OpenAIError:
    return OpenAIError(404, f"No such {what}: '{object_id}'.", param="id", code="not_found")


def invalid_api_key(message: str) -> OpenAIError:
    return OpenAIError(401, message, code="invalid_api_key")


def from_input_error(exc: InputError, field_names: Mapping[str, str]) -> OpenAIError:
    """A job-input error named as the request's field: `input.texts[2]` → `input[2]`."""
    if isinstance(exc, UnservableJob):
        # The request as a whole, not one field: no configured backend can serve it.
        return bad_request(exc.message, code=exc.code)
    param = exc.field
    for job_field, request_field in field_names.items():
        if param == job_field or param.startswith((f"{job_field}[", f"{job_field}.")):
            param = request_field + param[len(job_field) :]
            break
    return bad_request(f"{param}: {exc.message}", param=param, code="invalid_value")


def from_admission_refused(exc: AdmissionRefused) -> OpenAIError:
    if exc.status_code == 429:
        error_type, code = "rate_limit_error", "rate_limit_exceeded"
    else:
        error_type, code = "server_error", "queue_full"
    return OpenAIError(
        exc.status_code,
        exc.message,
        type=error_type,
        code=code,
        headers=exc.retry_headers,
        refused=exc,
    )
