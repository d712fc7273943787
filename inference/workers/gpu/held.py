"""The jobs a GPU worker holds: claimed, not yet run (or not run to their end)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from opentelemetry.trace import SpanContext

from inference.engines.protocol import RESUME
from inference.jobs.kinds import kind_of
from inference.jobs.transitions import Claim, Outcome
from inference.models import Job
from inference.scheduling.batch_window import BatchItem


def engine_payload(job: Job) -> dict:
    return kind_of(job.service.kind).engine_payload(job.service, job.input)


@dataclass
class Resume:
    """A generation that earlier passes left unfinished (chunked decoding)."""

    state: dict  # the engine's, to continue from (under RESUME in its payload)
    passes: int
    inference_ms: float  # over its passes so far
    started_at: datetime | None
    stream_seq: int = 0  # the next piece of streamed text's sequence number
    first_text_at: float | None = None


@dataclass
class Parts:
    """A job too large for one pass (more tokens than a batch's budget or its run budget
    allows): its texts run in consecutive ranges, pass after pass on this worker, and the
    ranges' results are put together in input order."""

    lengths: list[int]  # each text's tokens, as the model reads it (truncated)
    done: int = 0  # texts run so far
    results: list = field(default_factory=list)  # each earlier range's embeddings
    inference_ms: float = 0.0
    started_at: datetime | None = None


@dataclass
class Held:
    """A job this worker has claimed and not yet run (or not run to its end)."""

    job: Job
    claim: Claim
    item: BatchItem | None = None  # as the batch window sizes it; None until sized
    steps: int | None = None  # decode steps its next pass may take (None: to the end)
    resume: Resume | None = None
    parts: Parts | None = None  # a job run in parts, once its first range is sized
    part: tuple[int, int] | None = None  # the range of its texts its next pass runs
    trace: SpanContext | None = None  # its message's (renq_site.tracing), when tracing is on

    @property
    def started(self) -> bool:
        """An earlier pass ran part of it: it stays with this worker to its end."""
        return self.resume is not None or (self.parts is not None and self.parts.done > 0)

    def resumed_payload(self) -> dict:
        """The engine's payload for its next pass: where its earlier passes left off."""
        payload = engine_payload(self.job)
        if self.resume is not None:
            payload = {**payload, RESUME: self.resume.state}
        return payload


# The result of a pass that ran one range of a job run in parts, not its last: kept by the
# worker (Parts), nothing to store yet.
PART_RUN = "renq_part_run"


def left_unfinished(outcome: Outcome) -> bool:
    """The pass left this job unfinished (chunked decoding, or a range of a job run in
    parts): its result is state to continue from, not an outcome to store."""
    return outcome.result is not None and (RESUME in outcome.result or PART_RUN in outcome.result)
