"""A REST `POST /api/v1/jobs?wait=` of one realtime job offers its head start from the event
loop, before the request goes to its lane (renq_site.request_lanes): the lane's hop, the
middleware, authentication and validation then overlap the forward pass, as the OpenAI front
door's do. The job's id is chosen here and travels to the view in the request's scope."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import IO
from urllib.parse import parse_qs

from inference.delivery.waiting import async_redis, new_job_id
from inference.dispatch.head_start import offer_in_background
from inference.intake.head_start_target import head_start_target
from inference.jobs.tiers import Tier

JOBS_PATH = "/api/v1/jobs"
JOB_ID_SCOPE_KEY = "renq.head_start_job_id"
# A body this large is not one short realtime job's: the submit offers it, if anything.
MAX_BODY_BYTES = 64 * 1024


async def offer_before_lane(scope: dict, body_file: IO[bytes]) -> None:
    """Offer the head start of the job this request would submit, when it is a realtime job
    the process can judge from its cached rows (inference.intake.head_start_target)."""
    if scope.get("method") != "POST" or scope.get("path") != JOBS_PATH:
        return
    if "wait" not in parse_qs(scope.get("query_string", b"").decode("latin-1")):
        return
    headers = dict(scope.get("headers") or ())
    if b"idempotency-key" in headers:
        return  # the key may find an older job
    data = body_file.read(MAX_BODY_BYTES + 1)
    body_file.seek(0)
    try:
        body = json.loads(data) if len(data) <= MAX_BODY_BYTES else None
    except ValueError:
        return
    if not isinstance(body, dict) or body.get("priority") != Tier.REALTIME:
        return
    authorization = headers.get(b"authorization", b"").decode("latin-1")
    target = head_start_target(authorization, body.get("service"), lambda _: body.get("input"))
    if target is None:
        return
    queue, carried = target
    job_id = new_job_id()
    offer_in_background(async_redis(), queue, str(job_id), carried)
    scope[JOB_ID_SCOPE_KEY] = job_id
    # The offer goes out first: once on its lane, the request would hold the GIL until its
    # own first round trip.
    await asyncio.sleep(0)


def offered_job_id(request) -> uuid.UUID | None:
    """The id under which `offer_before_lane` offered this request's job, if it did."""
    return getattr(request, "scope", {}).get(JOB_ID_SCOPE_KEY)
