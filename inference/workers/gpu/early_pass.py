"""A realtime job's forward pass, started while its claim is on its way to Postgres.

A worker given a realtime message that carries its job's input (`INPUT_HEADER`) starts the
pass at once and claims beside it, so the claim's round trip and the forming of the batch
overlap the model instead of preceding it. The claim still decides: only a job it hands this
worker, and that the loop then runs alone and whole, has the pass's outcome announced and
stored; any other outcome is dropped, as a duplicate message's job is.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, replace

from django.conf import settings

from inference.dispatch.queues import served_service_names
from inference.engines import load_engine
from inference.intake.lookups import active_service
from inference.jobs.tiers import Tier
from inference.models import Job
from inference.workers.gpu.held import Held, engine_payload
from inference.workers.gpu.model_thread import ModelThread
from renq_site import tracing

logger = logging.getLogger(__name__)


@dataclass
class EarlyPass:
    """The pass started for one job before its claim returned."""

    job_id: str
    future: Future
    started_at: float  # time.monotonic()

    def adopt(self, held: Held) -> Future | None:
        """The pass's outcomes as the claimed job's, when `held` is that job run whole (not a
        range of it, not a generation in steps); None otherwise (the pass is then dropped)."""
        if str(held.job.pk) != self.job_id or held.part is not None or held.steps is not None:
            return None
        if held.resume is not None or held.item is None:
            return None
        tokens = held.item.tokens
        adopted: Future = Future()

        def settle(done: Future) -> None:
            error = done.exception()
            if error is not None:
                adopted.set_exception(error)
            else:
                adopted.set_result(
                    [replace(o, job=held.job, tokens=tokens) for o in done.result()]
                )

        self.future.add_done_callback(settle)
        return adopted


def start_early_pass(
    model_thread: ModelThread, job_id: str, queue: str, carried: str, trace
) -> EarlyPass | None:
    """Start the pass of the job whose input its message to `queue` carried; None when it
    cannot start before the claim (an unknown service, a continuous-batching or streaming
    model, an input it cannot read): the job then runs after its claim, as any other."""
    names = served_service_names({queue})
    service = active_service(names.pop()) if len(names) == 1 else None
    if service is None:
        return None
    try:
        engine = load_engine(service.kind, service.model_ref, device=settings.RENQ_DEVICE)
        job = Job(pk=uuid.UUID(job_id), service=service, tier=Tier.REALTIME)
        job.input = json.loads(carried)
        streamed = bool(engine_payload(job).get("stream"))
    except Exception:  # noqa: BLE001 - the claim and the usual path decide what happens
        logger.debug("no early pass for job %s", job_id, exc_info=True)
        return None
    if streamed or getattr(engine, "supports_continuous", False):
        return None
    span = tracing.start_batch_span(
        "renq.forward", [trace], service=service.name, batch_size=1, job_ids=[job_id]
    )
    started_at = time.monotonic()
    future = model_thread.infer(engine, [job], [0])
    tracing.end_when_done(span, future)
    return EarlyPass(job_id, future, started_at)
