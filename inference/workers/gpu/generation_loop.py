"""The generation loop: LLM jobs fed one by one into the engine's continuous-batching loop.

Where the LLM engine runs continuous batching (`LlmEngine.supports_continuous`), the worker
runs this loop instead of DrainLoop: no batch windows, passes or chunks. The loop's thread
pulls messages from the tier queues in the scheduler's order (realtime first, then the
weighted share, each queue in its fair-share order), claims their jobs and submits each to the
engine while the engine has a free row (plus a small lookahead, so a row that frees up is
filled in the next decode step without waiting for this thread). Each job's priority key goes
with it: tier, then its message's fair-share start tag, then arrival; a realtime job is
submitted at once even when every row is busy, and the engine pauses (or, short of cache,
evicts) a lower-tier row for it in the next step.

Each job's outcome is stored as soon as it finishes (store thread, OutcomeWriter), and a
message is acked once all its jobs are stored: a worker killed mid-generation leaves its
messages unacked, and their redelivery takes the claims over and runs the jobs again, so
every job ends final exactly once. Streaming jobs publish their text per token (TextRelay),
from the engine's thread. The task returns, as DrainLoop's does, when nothing is running and
the queues are empty, and stops pulling below realtime after DRAIN_LIMIT_S.
"""

from __future__ import annotations

import logging
import queue
import time
from dataclasses import dataclass

from django.utils import timezone

from inference.delivery.streaming import TextRelay
from inference.engines.protocol import Finished, RequestTooLarge
from inference.jobs.tiers import Tier
from inference.jobs.transitions import Outcome
from inference.metrics.log_fields import job_fields
from inference.models import Service
from inference.scheduling.cost_model import BatchCostModel
from inference.workers.cpu_pinning import pin_model_thread
from inference.workers.gpu.held import Held, engine_payload
from inference.workers.gpu.intake import Intake
from inference.workers.gpu.loop import COST_MODEL_REUSE_S, DRAIN_LIMIT_S
from inference.workers.gpu.report import BatchReport
from inference.workers.gpu.store_thread import OutcomeWriter
from inference.workers.tier_reader import (
    BROKER_ERRORS,
    PulledMessage,
    ReaderPool,
    TierQueueReader,
)

logger = logging.getLogger(__name__)

# Jobs submitted beyond the engine's rows: a row that frees up is refilled in the next step.
LOOKAHEAD_JOBS = 2
# While generations run: how often the realtime queue is looked at (a realtime job then
# starts within this plus one decode step), and the others when the engine has room (at once
# when a job finished). Each look is a broker round trip per tier, on the GIL the decode
# loop's Python needs too.
REALTIME_POLL_S = 0.005
FILL_POLL_S = 0.005


@dataclass
class Running:
    """A job in the engine."""

    held: Held
    started_at: object  # datetime, as Outcome records it
    started: float  # time.monotonic()
    tokens: int  # prompt + budget, as the job's attempt records it
    relay: TextRelay | None


class GenerationLoop:
    """One task's run of the loop; the engine's decode loop outlives it."""

    def __init__(
        self,
        service: Service,
        engine,
        reader: TierQueueReader | None,
        *,
        readers: ReaderPool | None,
        worker: str,
        report: BatchReport,
    ):
        self.service = service
        self.report = report
        self.intake = Intake.for_run(
            service,
            reader,
            readers=readers,
            worker=worker,
            report=report,
            drain_limit_s=DRAIN_LIMIT_S,
        )
        self.ledger, self.line = self.intake.ledger, self.intake.line
        cost_model = BatchCostModel(service.name, engine.device, reuse_s=COST_MODEL_REUSE_S)
        self.writer = OutcomeWriter(engine, cost_model, ledger=self.ledger, report=report)
        self._engine = engine
        self._generator = engine.continuous
        self._running: dict[str, Running] = {}
        # This run's finished generations (the engine's loop is shared by the process).
        self._results: queue.Queue[Finished] = queue.Queue()
        # Job id → (the tier of the queue its message came from, its fair-share start tag).
        self._queued_as: dict[str, tuple[Tier, float]] = {}
        self._last_fill = 0.0
        self._last_realtime = 0.0
        self._steps_at_start = self._generator.steps
        # The service's batch_size is the rows decoded together in a step, as it was the
        # jobs in a forward pass (capped by what the engine's cache was sized for).
        self._generator.set_rows(min(service.batch_size, engine.continuous_rows))
        # The decode loop is the model's thread: on the model's cores (RENQ_MODEL_CPUS).
        self._generator.set_thread_initializer(pin_model_thread)
        self._timed_out: set[str] = set()
        self._next_timeout_check = 0.0

    @property
    def capacity(self) -> int:
        return self._generator.rows + LOOKAHEAD_JOBS

    def hold(self, held: Held, tier: Tier | None) -> None:
        """A claimed job (a seed): submitted when the loop starts."""
        if tier is not None:
            self._queued_as[str(held.job.pk)] = (tier, 0.0)
        self.line.front.append(held)

    def run(self) -> None:
        try:
            self._serve()
        except BaseException:
            # The messages go back (BatchRunner); the engine's loop must not keep running
            # their jobs for nobody.
            for request_id in list(self._running):
                self._generator.cancel(request_id)
            self._running.clear()
            raise
        finally:
            self.report.batches += self._generator.steps - self._steps_at_start
            self.writer.written()

    def _serve(self) -> None:
        self._submit_held()
        while True:
            pulled_any = self._feed()
            finished = self._collect(wait_s=0.0 if pulled_any else self._wait_s())
            self._cancel_overdue()
            if finished:
                self._store(finished)
                self._last_fill = 0.0  # rows freed up: fill them now
                continue
            if not self._running and not self.line.holding and not pulled_any:
                return  # idle: nothing running, nothing waiting in the queues

    def _wait_s(self) -> float:
        if not self._running:
            return 0.0
        if len(self._running) < self.capacity and self.intake.pulling:
            return FILL_POLL_S
        return REALTIME_POLL_S

    def _feed(self) -> bool:
        """Pull and submit what the engine has room for (realtime whenever it is there).
        Returns whether anything was submitted."""
        if self.intake.reader is None:
            return False
        now = time.monotonic()
        room = self.capacity - len(self._running)
        pulled: list[PulledMessage] = []
        try:
            if (
                room > 0
                and self.intake.pulling
                and (not self._running or now - self._last_fill >= FILL_POLL_S)
            ):
                self._last_fill = now
                pulled = self.intake.pull(None, realtime=False, room=room)
            elif now - self._last_realtime >= REALTIME_POLL_S:
                self._last_realtime = now
                pulled = self.intake.pull(None, realtime=True, room=self.capacity)
        except BROKER_ERRORS:
            # Pulled messages return to their queues when the broken channel closes; what
            # runs is stored anyway, and a fresh connection opens for the next task.
            logger.warning("broker connection lost while pulling", exc_info=True)
            self.intake.reader_lost()
            return False
        if not pulled:
            return False
        for pm in pulled:
            for job_id in pm.job_ids:
                self._queued_as[job_id] = (pm.tier, pm.start_tag or 0.0)
        for held, _tier in self.intake.claim(pulled):
            self.line.front.append(held)
        return self._submit_held()

    def _submit_held(self) -> bool:
        submitted = False
        while self.line.front:
            self._submit(self.line.front.popleft())
            submitted = True
        return submitted

    def _submit(self, held: Held) -> None:
        job = held.job
        request_id = str(job.pk)
        payload = engine_payload(job)
        tier, start_tag = self._queued_as.pop(request_id, (Tier(job.tier), 0.0))
        relay = TextRelay({0: job.pk}) if payload.get("stream") else None
        running = Running(
            held=held,
            started_at=timezone.now(),
            started=time.monotonic(),
            tokens=self._engine.count_tokens(payload),
            relay=relay,
        )
        try:
            done = self._engine.start_generation(
                request_id,
                payload,
                priority=(tier.rank, start_tag),
                preempts=tier == Tier.REALTIME,
                on_text=None if relay is None else (lambda text, relay=relay: relay(0, text)),
                results=self._results,
            )
        except RequestTooLarge as exc:
            self._write(
                [(running, Outcome(job=job, error=str(exc), started_at=running.started_at))]
            )
            return
        if done is not None:  # nothing to generate: no room left in the context
            outcome = Outcome(job=job, result=done, started_at=running.started_at, tokens=0)
            self._write([(running, outcome)])
            return
        self._running[request_id] = running

    def _cancel_overdue(self) -> None:
        """A generation running past the service's inference_timeout is cancelled; it is
        stored as failed (a routed job moves down its cascade)."""
        limit_s = self.service.inference_timeout
        now = time.monotonic()
        if limit_s <= 0 or now < self._next_timeout_check:
            return
        self._next_timeout_check = now + min(1.0, limit_s / 4)
        for request_id, running in self._running.items():
            if request_id not in self._timed_out and now - running.started > limit_s:
                self._timed_out.add(request_id)
                self._generator.cancel(request_id)

    def _collect(self, wait_s: float) -> list[Finished]:
        """Finished generations of this loop's jobs, waiting up to `wait_s` for the first."""
        results = self._results
        found: list[Finished] = []
        try:
            item = results.get(timeout=wait_s) if wait_s > 0 else results.get_nowait()
            while True:
                if item.request_id in self._running:
                    found.append(item)
                item = results.get_nowait()
        except queue.Empty:
            pass
        return found

    def _store(self, finished: list[Finished]) -> None:
        done = []
        now = time.monotonic()
        for item in finished:
            running = self._running.pop(item.request_id)
            job = running.held.job
            common = {
                "job": job,
                "started_at": running.started_at,
                "inference_ms": (now - running.started) * 1000,
                "tokens": running.tokens,
            }
            if item.request_id in self._timed_out:
                self._timed_out.discard(item.request_id)
                limit_s = self.service.inference_timeout
                error = f"the generation exceeded the service's inference_timeout ({limit_s:g} s)"
                done.append((running, Outcome(error=error, **common)))
                continue
            try:
                result = self._engine.generation_result(item)
            except Exception as exc:
                logger.warning("job %s failed: %s", job.pk, exc, extra=job_fields(job))
                done.append((running, Outcome(error=str(exc), dead_letter=True, **common)))
                continue
            relay = running.relay
            if relay is not None and 0 in relay.first_text_at:
                ttft_ms = (relay.first_text_at[0] - job.created_at.timestamp()) * 1000
                result = {**result, "first_token_ms": round(ttft_ms, 3)}
            done.append((running, Outcome(result=result, **common)))
        self._write(done)

    def _write(self, done: list[tuple[Running, Outcome]]) -> None:
        if not done:
            return
        self.writer.write(
            [running.held for running, _ in done], [outcome for _, outcome in done], self.service
        )
