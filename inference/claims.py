"""Atomic claims and outcomes in Postgres: the guarantee that a job runs once.

A worker claims jobs with one conditional UPDATE (queued → running, new claim token). A
duplicate message finds the job no longer queued and is dropped. A *redelivered* message of a
running job means the previous holder lost its channel (died, or lost the broker), so the
claim is taken over with a new token; the old holder's late write then matches no row.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from psycopg2.extras import execute_values

from inference.models import Job, JobStatus
from inference.tiers import Tier

_CLAIM_SQL = """
UPDATE inference_job
   SET status = 'running', claim_token = %(token)s, claimed_at = %(now)s,
       attempts = attempts + 1, worker = %(worker)s
 WHERE id = ANY(%(ids)s::uuid[])
   AND (status = 'queued'
        OR (status = 'running' AND id = ANY(%(redelivered)s::uuid[])
            AND attempts < %(max_attempts)s))
RETURNING id
"""

_POISON_SQL = """
UPDATE inference_job
   SET status = 'failed', finished_at = %(now)s, claim_token = NULL,
       error = 'the worker running this job was lost ' || attempts || ' times; giving up'
 WHERE id = ANY(%(redelivered)s::uuid[]) AND status = 'running'
   AND attempts >= %(max_attempts)s
"""

# One statement for a whole batch; every row carries the claim token it must still hold.
_SUCCEED_SQL = """
UPDATE inference_job AS j
   SET status = 'succeeded', result = v.result::jsonb, finished_at = clock_timestamp(),
       started_at = v.started_at, inference_ms = v.inference_ms, batch_size = v.batch_size,
       input_tokens = v.tokens
  FROM (VALUES %s) AS v(id, token, result, started_at, inference_ms, batch_size, tokens)
 WHERE j.id = v.id AND j.claim_token = v.token AND j.status = 'running'
"""
_SUCCEED_ROW = (
    "(%s::uuid, %s::uuid, %s, %s::timestamptz, %s::double precision, %s::integer, %s::integer)"
)


@dataclass
class Claim:
    token: uuid.UUID
    jobs: list[Job] = field(default_factory=list)
    expired: list[Job] = field(default_factory=list)


def claim_jobs(
    job_ids: Sequence[str],
    *,
    redelivered_ids: Iterable[str] = (),
    worker: str = "",
) -> Claim:
    """Claim whichever of `job_ids` are runnable. Interactive jobs that waited past their
    queue_timeout/total_timeout are marked expired instead of run."""
    token = uuid.uuid4()
    now = timezone.now()
    params: dict[str, Any] = {
        "token": token,
        "now": now,
        "worker": worker[:200],
        "ids": list(dict.fromkeys(job_ids)),
        "redelivered": list(redelivered_ids),
        "max_attempts": settings.RENQ_MAX_ATTEMPTS,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        if params["redelivered"]:
            cursor.execute(_POISON_SQL, params)
        cursor.execute(_CLAIM_SQL, params)
        claimed_ids = [row[0] for row in cursor.fetchall()]
    claim = Claim(token=token)
    if not claimed_ids:
        return claim
    jobs = Job.objects.select_related("service", "tenant").in_bulk(claimed_ids)
    for job_id in params["ids"]:
        job = jobs.get(uuid.UUID(str(job_id)))
        if job is None:
            continue
        if _missed_deadline(job, now):
            claim.expired.append(job)
        else:
            claim.jobs.append(job)
    if claim.expired:
        Job.objects.filter(pk__in=[j.pk for j in claim.expired], claim_token=token).update(
            status=JobStatus.EXPIRED,
            finished_at=now,
            error="waited longer than the service's queue_timeout before a worker was free",
        )
    return claim


def _missed_deadline(job: Job, now) -> bool:
    if not Tier(job.tier).is_interactive:
        return False
    waited_s = (now - job.created_at).total_seconds()
    service = job.service
    return waited_s > service.queue_timeout or waited_s > service.total_timeout


@dataclass
class Outcome:
    job: Job
    result: dict | None = None
    error: str = ""
    started_at: datetime | None = None
    inference_ms: float | None = None
    batch_size: int | None = None
    tokens: int | None = None


def store_outcomes(token: uuid.UUID, outcomes: Sequence[Outcome]) -> int:
    """Store results and failures of one batch in one round trip each. Only rows still held
    under `token` change. Returns how many rows were written."""
    now = timezone.now()
    written = 0
    successes = [o for o in outcomes if o.result is not None]
    failures = [o for o in outcomes if o.result is None]
    with transaction.atomic(), connection.cursor() as cursor:
        if successes:
            rows = [
                (
                    str(o.job.pk),
                    str(token),
                    json.dumps(o.result),
                    o.started_at or now,
                    o.inference_ms,
                    o.batch_size,
                    o.tokens,
                )
                for o in successes
            ]
            execute_values(
                cursor.cursor, _SUCCEED_SQL, rows, template=_SUCCEED_ROW, page_size=len(rows)
            )
            written += cursor.cursor.rowcount
        for o in failures:
            written += Job.objects.filter(
                pk=o.job.pk, claim_token=token, status=JobStatus.RUNNING
            ).update(
                status=JobStatus.FAILED,
                error=o.error[:4000],
                started_at=o.started_at or now,
                finished_at=now,
            )
    return written


def release_jobs(token: uuid.UUID, job_ids: Iterable[uuid.UUID]) -> int:
    """Give claimed jobs back untouched (they did not fit this batch); the caller requeues
    their messages. The attempt is not counted: nothing ran."""
    return Job.objects.filter(
        pk__in=list(job_ids), claim_token=token, status=JobStatus.RUNNING
    ).update(status=JobStatus.QUEUED, claim_token=None, claimed_at=None, attempts=F("attempts") - 1)
