"""What every backend adapter shares: one method, one result type, one error hierarchy.

    BackendError                     retryable unless said otherwise; the cascade moves on
    ├── BackendSkipped               not called: cooldown, rate limit or open breaker
    ├── BackendMisconfigured         e.g. its API key variable is not set
    ├── BackendUnavailable           connection refused/reset, DNS          (breaker)
    ├── BackendTimeout               connect or read timeout                (breaker)
    ├── UpstreamServerError          5xx                                    (breaker)
    ├── UpstreamMalformed            not JSON, or not the documented shape  (breaker)
    ├── UpstreamRateLimited          429; carries the headers for the cooldown
    ├── UpstreamRejected             other 4xx (401, 404, ...): this backend cannot, another may
    │   └── UpstreamBadInput         400/413/422: the input is bad; FINAL, the cascade ends
    └── LocalEngineError             the local GPU worker raised             (breaker)

Library errors (requests, json) are translated to these in exactly one place per adapter.
"""

from __future__ import annotations

import abc
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from routing.request import RoutingRequest

# The service kinds renq's result shapes are defined for.
SERVICE_KINDS = ("embedding", "reranker", "llm")


class Placement(enum.Enum):
    """Where a job given to a backend runs, and so which queue its message goes to."""

    LOCAL_WORKERS = "local"  # the service's own GPU workers (its tier queues); no call here
    IO_WORKERS = "io"  # an I/O worker calls the backend's API (the io.<tier> queues)


@dataclass
class AdapterResult:
    """A successful call: the job's result in renq's own result shape, plus usage."""

    result: dict
    input_tokens: int = 0
    output_tokens: int = 0
    status_code: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    latency_s: float = 0.0


class BackendError(Exception):
    retryable: bool = True
    # Counts as a failure of the backend itself (opens its breaker), not of the job's input.
    breaker_failure: bool = False
    outcome: str = "failed"

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        headers: Mapping[str, str] | None = None,
    ):
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.headers: Mapping[str, str] = headers or {}


class BackendSkipped(BackendError):
    outcome = "skipped"


class BackendMisconfigured(BackendError):
    pass


class BackendUnavailable(BackendError):
    breaker_failure = True


class BackendTimeout(BackendError):
    breaker_failure = True
    outcome = "timeout"


class UpstreamServerError(BackendError):
    breaker_failure = True


class UpstreamMalformed(BackendError):
    breaker_failure = True


class UpstreamRateLimited(BackendError):
    outcome = "rate_limited"


class UpstreamRejected(BackendError):
    pass


class UpstreamBadInput(UpstreamRejected):
    retryable = False
    outcome = "rejected"


class LocalEngineError(BackendError):
    breaker_failure = True


class BackendAdapter(abc.ABC):
    """One per backend kind. `call` runs one job's payload and returns renq's result shape,
    or raises a BackendError; `misconfiguration` says why the router may never pick it as
    configured, `unavailable_reason` why it must not pick it now."""

    placement: ClassVar[Placement] = Placement.IO_WORKERS
    service_kinds: ClassVar[tuple[str, ...]] = SERVICE_KINDS

    def __init__(self, backend: Any):
        self.backend = backend

    def misconfiguration(self) -> str | None:
        """Why this backend can serve no job until its configuration changes, or None."""
        return None

    def context_tokens(self, request: RoutingRequest) -> int:
        """The longest sequence of the job that this backend's context must hold."""
        return request.sequence_tokens

    def unavailable_reason(self, request: RoutingRequest) -> str | None:
        """Why this backend cannot take the job now (beyond limits and breaker), or None."""
        return None

    @abc.abstractmethod
    def call(self, job_payload: dict, service_kind: str) -> AdapterResult: ...
