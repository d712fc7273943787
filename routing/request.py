"""What the router needs to know about one job, handed in by the caller.

routing knows nothing of jobs: the job's lifecycle (inference) describes the job as a
`RoutingRequest` — its service, kind, tier, estimated tokens, its longest sequence — and
gives a `WorkerProbe` that answers, only if asked, whether workers are there and how long the
local ones would take.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class LocalWait:
    """Predicted wait on the local workers: jobs ahead / their measured throughput."""

    wait_s: float
    jobs_ahead: int
    throughput_jobs_s: float
    target_s: float
    measured: bool

    @property
    def meets_target(self) -> bool:
        return self.wait_s <= self.target_s


class WorkerProbe(Protocol):
    """What the router may ask about the workers that would carry the job out."""

    def local_consumer_count(self) -> int:
        """GPU workers consuming the service's local queues now (0: none is there)."""

    def io_consumer_count(self) -> int:
        """I/O workers consuming the cloud-call queues now (0: a cloud job would strand)."""

    def predicted_wait(self) -> LocalWait:
        """How long the job would wait on the local workers, against its tier's target."""


@dataclass(frozen=True)
class RoutingRequest:
    service_id: int
    service_name: str
    service_kind: str
    tier: str
    input_tokens: int
    output_tokens: int
    workers: WorkerProbe
    # The longest single sequence one model call reads, as sent (an embedding text, the query
    # with one document, a prompt with its completion): what a backend's context must hold.
    # None: the whole job is one sequence.
    longest_sequence_tokens: int | None = None
    # The service's own model truncates each sequence at this many tokens (encoders do), so
    # the local workers read no more of a longer one; None when it does not truncate.
    local_truncation_tokens: int | None = None

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def sequence_tokens(self) -> int:
        """The longest sequence as sent, which a backend that does not truncate must hold."""
        return self.tokens if self.longest_sequence_tokens is None else self.longest_sequence_tokens
