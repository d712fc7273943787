"""Attempt storage: one `JobAttempt` row per backend that tried a job, with its cost.

routing knows a job only by its id; the job lifecycle says when an attempt happened.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from django.dispatch import Signal
from django.utils import timezone

from routing.models import AttemptOutcome, Backend, JobAttempt


@dataclass
class AttemptRecord:
    job_id: object
    backend: Backend
    started_at: datetime
    outcome: str
    error: str = ""
    status_code: int | None = None
    input_tokens: int = 0
    output_tokens: int = 0
    worker: str = ""

    def row(self, finished_at: datetime) -> JobAttempt:
        return JobAttempt(
            job_id=self.job_id,
            backend=self.backend,
            started_at=self.started_at,
            finished_at=finished_at,
            outcome=self.outcome,
            status_code=self.status_code,
            error=self.error[:4000],
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cost=self.backend.cost_of(self.input_tokens, self.output_tokens),
            worker=self.worker[:200],
        )


# Sent with `attempts` (the stored JobAttempt rows) after every record_attempts: the job
# lifecycle counts them (inference.metrics.collector) without routing knowing who listens.
attempts_recorded = Signal()


def record_attempts(records: Iterable[AttemptRecord]) -> list[JobAttempt]:
    """Store attempts in one INSERT."""
    now = timezone.now()
    attempts = JobAttempt.objects.bulk_create([record.row(now) for record in records])
    attempts_recorded.send(sender=JobAttempt, attempts=attempts)
    return attempts


def record_attempt(record: AttemptRecord) -> JobAttempt:
    return record_attempts([record])[0]


def tried_backend_ids(job_id: object) -> set[int]:
    return set(JobAttempt.objects.filter(job_id=job_id).values_list("backend_id", flat=True))


def attempt_reasons(job_id: object) -> list[str]:
    """'backend: why' for every attempt of the job, oldest first."""
    attempts = (
        JobAttempt.objects.filter(job_id=job_id)
        .select_related("backend")
        .order_by("started_at", "id")
    )
    return [f"{a.backend.name}: {a.error or a.outcome}" for a in attempts]


__all__ = [
    "AttemptOutcome",
    "AttemptRecord",
    "attempt_reasons",
    "attempts_recorded",
    "record_attempt",
    "record_attempts",
    "tried_backend_ids",
]
