"""A realtime job's forward pass, started before its claim: while the claim is on its way to
Postgres, or, from a head start, before the job is even committed.

A worker given a realtime message that carries its job's input (`INPUT_HEADER`) starts the
pass at once and claims beside it, so the claim's round trip and the forming of the batch
overlap the model instead of preceding it. An idle worker also takes head starts
(inference.dispatch.head_start): the web offers a realtime job's input before its commit, and
the pass then runs while the INSERT, the publish and the delivery are under way; when its
submitter hands the job over (inference.dispatch.handover), this worker claims it without a
message at all. The claim still decides: only a job it hands this worker, and that the loop
then runs alone and whole on the input the pass ran on, has the pass's outcome announced and
stored; any other outcome is dropped, as a duplicate message's job is.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import redis
from django.conf import settings

from inference.dispatch import handover
from inference.dispatch.head_start import MAX_OFFER_AGE_S, Offer, take_offer
from inference.engines import load_engine
from inference.intake.lookups import active_service_of_queue
from inference.jobs.tiers import Tier
from inference.models import Job
from inference.workers.gpu.held import Held, engine_payload
from inference.workers.gpu.model_thread import ModelThread
from renq_site import tracing
from renq_site.db_sessions import close_old_connections_checked_once_a_second

if TYPE_CHECKING:
    from opentelemetry.trace import SpanContext

logger = logging.getLogger(__name__)

# How long an offer that comes while a run is under way waits for it to end.
RUN_END_WAIT_S = 0.01
# How long a worker that took an offer waits for its submitter's answer (the job's commit
# comes first): past it the job goes the message's way. A submit refused or answered from
# the cache never answers.
ANSWER_WAIT_S = 0.2
# How long one wait for a head-start offer blocks, and the pause after Redis failed.
OFFER_WAIT_S = 5
REDIS_RETRY_S = 1.0


@dataclass
class EarlyPass:
    """The pass started for one job before its claim returned."""

    job_id: str
    service_name: str
    future: Future
    started_at: float  # time.monotonic()
    started_ns: int  # time.time_ns(), for its span
    ended_ns: int | None = None
    input: dict | None = None  # what the pass ran on

    def trace_in(self, trace: SpanContext | None) -> None:
        """The pass in the trace of its job's message, over the time it ran (a head start's
        began before there was one)."""
        span = tracing.start_batch_span(
            "renq.forward",
            [trace],
            start_time_ns=self.started_ns,
            service=self.service_name,
            batch_size=1,
            job_ids=[self.job_id],
        )
        if span is not None:
            self.future.add_done_callback(lambda _: span.end(end_time=self.ended_ns))

    def adopt(self, held: Held) -> Future | None:
        """The pass's outcomes as the claimed job's, when `held` is that job run whole (not a
        range of it, not a generation in steps); None otherwise (the pass is then dropped)."""
        if str(held.job.pk) != self.job_id or held.part is not None or held.steps is not None:
            return None
        if held.job.input != self.input:
            return None  # an offer made before the submit ran on what the job turned out not to be
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
    model_thread: ModelThread, job_id: str, queue: str, carried: str, trace: SpanContext | None
) -> EarlyPass | None:
    """Start the pass of the job whose input its message to `queue` carried; None when it
    cannot start before the claim (an unknown service, a continuous-batching or streaming
    model, an input it cannot read): the job then runs after its claim, as any other."""
    service = active_service_of_queue(queue)
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
    started_at, started_ns = time.monotonic(), time.time_ns()
    future = model_thread.infer(engine, [job], [0])
    early = EarlyPass(job_id, service.name, future, started_at, started_ns, input=job.input)
    future.add_done_callback(lambda _: setattr(early, "ended_ns", time.time_ns()))
    if trace is not None:  # a head start has none yet: traced when its run adopts it
        early.trace_in(trace)
    return early


class HeadStarts:
    """The head starts one worker process takes: a thread waits for offers for its realtime
    queues and, while no run is under way and the model thread is free, starts the offered
    job's pass. When its submitter answers and hands the job over (handover), `serve` runs it
    on this thread; otherwise the next run adopts it when its seed is that job, or it is
    dropped."""

    def __init__(self, model_thread: ModelThread, serve: Callable[[EarlyPass], object]):
        self._model_thread = model_thread
        self._serve = serve
        self._lock = threading.Condition()
        self._running = False
        self._started: EarlyPass | None = None
        self._listening = False

    def listen(self, queues: Sequence[str]) -> None:
        """Start taking offers for `queues` (once per process, after the pool's fork)."""
        if self._listening or not queues:
            return
        self._listening = True
        threading.Thread(
            target=self._listen, args=(list(queues),), name="renq-head-starts", daemon=True
        ).start()

    def begin(self, seed_job_id: str | None) -> EarlyPass | None:
        """A run starts (no offer is taken until it ends): the head start of its seed, if
        this process started one."""
        with self._lock:
            self._running = True
            started, self._started = self._started, None
        return started if started is not None and started.job_id == seed_job_id else None

    def end(self) -> None:
        """The run's model is free (its last outcomes may still be being stored): offers are
        taken again."""
        with self._lock:
            self._running = False
            self._lock.notify_all()

    def offered(self, offer: Offer, client: redis.Redis | None = None) -> EarlyPass | None:
        """Start the offered job's pass if this process is idle, or a run under way ends within
        RUN_END_WAIT_S; the pass started, or None. With `client` and an offer its submitter
        answers, the job is taken (handover): handed over, it is served here and now."""
        if offer.age_s > MAX_OFFER_AGE_S:
            return None
        with self._lock:
            # A sequential client's next request comes as the last one's run is ending.
            self._lock.wait_for(lambda: not self._running, timeout=RUN_END_WAIT_S)
            busy = self._started is not None and not self._started.future.done()
            if self._running or busy:
                return None
            early = start_early_pass(
                self._model_thread, offer.job_id, offer.queue, offer.carried, None
            )
            taken = (
                early is not None
                and client is not None
                and offer.answered
                and handover.take(client, offer.job_id)
            )
            if not taken:
                self._started = early
                return early
        if handover.await_answer(client, offer.job_id, ANSWER_WAIT_S):
            self._serve(early)
            return early
        with self._lock:
            # Its message is on its way: a run that has not begun yet adopts the pass.
            if not self._running:
                self._started = early
        return early

    def _listen(self, queues: list[str]) -> None:
        client = redis.Redis.from_url(
            settings.RENQ_REDIS_URL, socket_timeout=OFFER_WAIT_S + 5, socket_connect_timeout=5
        )
        while True:
            try:
                offer = take_offer(client, queues, OFFER_WAIT_S)
            except redis.RedisError:
                time.sleep(REDIS_RETRY_S)
                continue
            if offer is None:
                continue
            try:
                self.offered(offer, client)
            except Exception:  # noqa: BLE001 - a head start must never stop the next one
                logger.warning("head start for job %s failed", offer.job_id, exc_info=True)
            finally:
                # As a task's start does: a handed-over job's claim and store query Postgres.
                close_old_connections_checked_once_a_second()
