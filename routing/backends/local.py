"""The local backend: the service's own GPU workers, reached through its tier queues.

Nothing is called from here; a job given to it is published to the service's tier queues and a
GPU worker runs it in a micro-batch. It is unavailable while no worker consumes those queues.
"""

from __future__ import annotations

from routing.backends.base import AdapterResult, BackendAdapter, BackendMisconfigured, Placement
from routing.request import RoutingRequest


class LocalAdapter(BackendAdapter):
    placement = Placement.LOCAL_WORKERS

    def context_tokens(self, request: RoutingRequest) -> int:
        # The service's own model reads no more of a sequence than its max length.
        if request.local_truncation_tokens is None:
            return request.sequence_tokens
        return min(request.sequence_tokens, request.local_truncation_tokens)

    def unavailable_reason(self, request: RoutingRequest) -> str | None:
        if request.workers.local_consumer_count() == 0:
            return f"no worker consuming the {request.service_name} queues"
        return None

    def call(self, job_payload: dict, service_kind: str) -> AdapterResult:
        raise BackendMisconfigured(
            f"{self.backend.name}: local backends run on the GPU workers, not over HTTP"
        )
