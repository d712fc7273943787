"""The jobs a GPU worker holds: claimed, not yet run (or not run to their end)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from inference.engines.llm import RESUME
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
class Held:
    """A job this worker has claimed and not yet run (or not run to its end)."""

    job: Job
    claim: Claim
    item: BatchItem | None = None  # as the batch window sizes it; None until sized
    steps: int | None = None  # decode steps its next pass may take (None: to the end)
    resume: Resume | None = None

    def resumed_payload(self) -> dict:
        """The engine's payload for its next pass: where its earlier passes left off."""
        payload = engine_payload(self.job)
        if self.resume is not None:
            payload = {**payload, RESUME: self.resume.state}
        return payload


def left_unfinished(outcome: Outcome) -> bool:
    """The pass stopped this generation early (chunked decoding): its result is the engine's
    state to continue from, not an outcome to store."""
    return outcome.result is not None and RESUME in outcome.result
