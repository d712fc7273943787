"""The drain loop: what runs next, pipelined so the model is not left waiting for the queue.

While a forward pass runs on the model thread, the loop's thread forms and claims the next
batch and the store thread writes the previous one's outcomes; the forward passes themselves
run one after another. Before starting a batch of non-realtime work formed during the
previous pass, the loop looks for realtime work and runs it first, and makes room for the
work of a tenant that had none waiting (fair share) that reached its tiers' queues meanwhile.
A chunked generation that a pass left unfinished stays claimed in the line and waits for its
tier's turn.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import replace

import numpy as np
from django.utils import timezone

from inference.engines.protocol import RESUME
from inference.jobs.tiers import Tier
from inference.jobs.transitions import Outcome
from inference.models import Service
from inference.scheduling.cost_model import BatchCostModel
from inference.workers.gpu.early_pass import EarlyPass
from inference.workers.gpu.former import BatchFormer
from inference.workers.gpu.held import PART_RUN, Held, Resume, left_unfinished
from inference.workers.gpu.intake import Intake
from inference.workers.gpu.model_thread import ModelThread
from inference.workers.gpu.report import BatchReport
from inference.workers.gpu.store_thread import OutcomeWriter, beside_stores
from inference.workers.tier_reader import (
    BROKER_ERRORS,
    ReaderPool,
    TierQueueReader,
    WeightedShare,
)
from renq_site import tracing

logger = logging.getLogger(__name__)

# One task keeps forming batches while work is waiting for at most this long (its seed message
# stays unacked meanwhile): far below the 300 s task limit and RabbitMQ's consumer_timeout.
DRAIN_LIMIT_S = 20.0
# The next batch is formed as late in the running pass as forming allows: work arriving
# meanwhile is then taken in priority order (tier, plan, tenant) and runs in the next pass, not
# the one after. It starts FORM_MARGIN x the measured forming time (at least FORM_AHEAD_S)
# before the pass's expected end, halfway through until a pass was measured. A form that
# found nothing is repeated when the pass ends, so nothing arriving meanwhile waits for a task.
FORM_AHEAD_S = 0.05
FORM_MARGIN = 2.0
# A batch formed during the previous pass looks for fresh work before it starts only
# when it is predicted to run at least this long: the look (a basic.get per tier it holds)
# keeps the model idle, and a shorter pass bounds what the fresh work waits anyway.
FRESH_LOOK_MIN_S = 0.02
# One read of the service's cost model serves the loop this long (its own batches refresh it).
COST_MODEL_REUSE_S = 1.0


class DrainLoop:
    """One run of the loop, over the line of jobs it holds claimed and the tier queues."""

    def __init__(
        self,
        service: Service,
        engine,
        reader: TierQueueReader | None,
        *,
        readers: ReaderPool | None,
        model_thread: ModelThread,
        worker: str,
        report: BatchReport,
        also_served: Sequence[str] = (),
    ):
        self.report = report
        self.intake = Intake.for_run(
            service,
            reader,
            readers=readers,
            worker=worker,
            report=report,
            drain_limit_s=DRAIN_LIMIT_S,
            also_served=also_served,
        )
        self.ledger, self.line = self.intake.ledger, self.intake.line
        # One per task: a task starts from what every worker has stored, so a chunked
        # generation is not sized on another task's stale prediction.
        cost_model = BatchCostModel(service.name, engine.device, reuse_s=COST_MODEL_REUSE_S)
        self.former = BatchFormer(service, engine, cost_model, line=self.line, intake=self.intake)
        self.writer = OutcomeWriter(engine, cost_model, ledger=self.ledger, report=report)
        self._engine = engine
        self._model_thread = model_thread
        self._started_at = 0.0  # time.monotonic() when the running pass started
        self._predicted_s = 0.0  # the running pass's predicted run
        self._form_s = 0.0  # how long forming a batch has taken (moving average)
        self._early_s: float | None = None  # how much sooner than predicted passes ended

    def hold(self, held: Held, tier: Tier | None) -> None:
        """A claimed job to run (a seed), held in the line until its batch is formed."""
        self.former.hold(held, tier)

    def run(
        self,
        early: EarlyPass | None = None,
        on_model_free: Callable[[], None] | None = None,
        *,
        store_behind: bool = False,
    ) -> None:
        """`early`: the seed's pass, started before its claim (used if it forms the first
        batch alone). `on_model_free`: called once the last pass has ended, its answers are
        out and no batch follows, before its outcomes are handed to the store thread.
        `store_behind`: return once the last outcomes are handed to the store thread, which
        then finishes them (a run with no message to ack: its thread has other work)."""
        try:
            self._drain(early, on_model_free or (lambda: None))
        finally:
            if store_behind:
                beside_stores(self.writer.written_or_logged)
            else:
                # The last batch's outcomes are stored and its messages acked before the task
                # returns, or, after an error, before the unacked rest go back to their queues.
                self.writer.written()

    def _drain(self, early: EarlyPass | None, on_model_free: Callable[[], None]) -> None:
        # A realtime seed starts its pass at once: realtime work waiting beside it is pulled
        # while that pass runs, for the next one. At idle there is none, and looking for it
        # first would put a broker round trip and a cost-model read between claim and pass.
        realtime_seed = any(held.job.tier == Tier.REALTIME for held in self.line.front)
        batch = self.former.form(company=not realtime_seed)
        running: tuple[list[Held], Future] | None = None
        if batch:
            running = (batch, self._adopt(batch, early) or self._start(batch))
        else:
            on_model_free()
        while running is not None:
            held, future = running
            # While the model runs: form and claim the next batch, as late as the pass allows,
            # so what arrives meanwhile is ordered by tier and plan, not by arrival.
            self._wait_until_due(held, future)
            forming_at = time.monotonic()
            upcoming = self.former.form() if self.line.holding or self.intake.pulling else []
            formed_early = bool(upcoming)
            formed_at = time.monotonic()
            if upcoming:
                self._form_s = (self._form_s + formed_at - forming_at) / 2
            outcomes = self._wait(held, future)
            unfinished, finished = self._carry_on(held, outcomes)
            # The waiting clients first: their answers wait neither for the next batch to
            # form (a pull, a claim, company) nor for the previous batch's store.
            announced = self.writer.announce(held, finished, self.former.service)
            if not upcoming and (
                unfinished or (self.intake.pulling and time.monotonic() - formed_at > FORM_AHEAD_S)
            ):
                upcoming = self.former.form()  # what it left unfinished; what arrived since
            upcoming = self.realtime_first(upcoming)
            if formed_early:
                upcoming = self.fresh_first(upcoming)
            running = (upcoming, self._start(upcoming)) if upcoming else None
            if running is None:
                # Before the write and the cost model's update: a sequential client's next
                # request may already be offering its head start.
                on_model_free()
            # While the next batch runs: this one's outcomes go to the store thread (once the
            # one before is stored and its finished messages acked).
            self.writer.write(
                held, finished, self.former.service, passed=outcomes, announced=announced
            )

    def realtime_first(self, upcoming: list[Held]) -> list[Held]:
        """A batch formed during the previous pass yields to realtime work that arrived
        since: its jobs stay claimed and go back to the front of the line."""
        # Also after the drain limit, while claimed jobs are still being run.
        if not upcoming or any(h.item.realtime for h in upcoming):
            return upcoming
        realtime = self.former.form(only_realtime=True, pull=True)
        if not realtime:
            return upcoming
        self.line.put_first(upcoming)
        return realtime

    def fresh_first(self, upcoming: list[Held]) -> list[Held]:
        """A batch formed during the previous pass makes room for work that went out fresh to
        its tiers' queues since (its tenant had no work ahead of the queue's virtual time, see
        fair_share): that tenant waits for the pass that was running, not for one more. The
        jobs it displaces go back to the front of the line (and to their queues when the pass
        starts, for whichever worker is free first)."""
        if not upcoming or not self.intake.pulling or any(h.item.realtime for h in upcoming):
            return upcoming
        if self.former.predict_s(sum(h.item.tokens for h in upcoming)) < FRESH_LOOK_MIN_S:
            return upcoming
        tiers = sorted(
            {Tier(h.job.serving_tier or h.job.tier) for h in upcoming}.intersection(
                WeightedShare.TIERS
            ),
            key=lambda tier: tier.rank,
        )
        try:
            pulled = self.intake.pull_fresh(tiers)
        except BROKER_ERRORS:
            logger.warning("broker connection lost while looking for fresh work", exc_info=True)
            self.intake.reader_lost()
            return upcoming
        if not pulled:
            return upcoming
        window = self.former.new_window()
        self.former.admit(pulled, window)
        displaced = []
        for held in upcoming:
            if displaced or not window.offer(held.item):
                displaced.append(held)
        self.line.put_first(displaced)
        return [item.value for item in window.items]

    def _wait_until_due(self, batch: list[Held], future: Future) -> None:
        """Until it is time to form the next batch (see FORM_MARGIN), or the pass ends."""
        predicted_s = self._predicted_s = self.former.predict_s(sum(h.item.tokens for h in batch))
        if self._early_s is None:
            form_after_s = min(predicted_s / 2, predicted_s - FORM_AHEAD_S)
        else:
            expected_s = predicted_s - self._early_s
            form_after_s = expected_s - max(FORM_AHEAD_S, FORM_MARGIN * self._form_s)
        due_in_s = self._started_at + form_after_s - time.monotonic()
        if due_in_s > 0:
            wait_futures([future], timeout=due_in_s)

    def _start(self, batch: list[Held]) -> Future:
        self.report.batches += 1
        self._started_at = time.monotonic()
        plans = [(h.steps, h.resume, h.part) for h in batch]
        span = tracing.start_batch_span(
            "renq.forward",
            [h.trace for h in batch],
            service=self.former.service.name,
            batch_size=len(batch),
            job_ids=[str(h.job.pk) for h in batch] if tracing.enabled() else None,
        )
        future = self._model_thread.infer(
            self._engine,
            [h.job for h in batch],
            [h.item.tokens for h in batch],
            plans if any(any(plan) for plan in plans) else None,
        )
        tracing.end_when_done(span, future)
        # Work-sharing: this worker holds what its next pass runs (formed while this one
        # runs), not what a peer could start now; handed back while the model is busy.
        self.intake.hand_back(self.line.take_unstarted())
        return future

    def _adopt(self, batch: list[Held], early: EarlyPass | None) -> Future | None:
        """The early pass as this batch's, when the batch is its job alone and whole."""
        future = early.adopt(batch[0]) if early is not None and len(batch) == 1 else None
        if future is None:
            return None
        self.report.batches += 1
        self._started_at = early.started_at
        self.intake.hand_back(self.line.take_unstarted())
        return future

    def _wait(self, batch: list[Held], future: Future) -> list[Outcome]:
        limit_s = self.former.service.inference_timeout
        started_at = timezone.now()
        try:
            outcomes = future.result(timeout=limit_s if limit_s > 0 else None)
            early_s = max(0.0, self._predicted_s - (time.monotonic() - self._started_at))
            self._early_s = early_s if self._early_s is None else (self._early_s + early_s) / 2
            return outcomes
        except FutureTimeout:
            # The attempt is over for the jobs (a routed job moves down its cascade); the
            # pass itself cannot be interrupted, so the next one starts after it ends.
            logger.warning("batch of %d exceeded inference_timeout %g s", len(batch), limit_s)
            future.exception()  # wait for the model thread to be free again
            error = f"the forward pass exceeded the service's inference_timeout ({limit_s:g} s)"
            return [Outcome(job=h.job, error=error, started_at=started_at) for h in batch]

    def _carry_on(
        self, batch: list[Held], outcomes: list[Outcome]
    ) -> tuple[bool, list[Outcome]]:
        """Jobs the pass left unfinished (a chunked generation, a job run in parts with ranges
        left) stay claimed in the line: each waits for its tier's turn in the weighted share
        like any claimed job, so it does not run ahead of claimed higher-tier work (a realtime
        one goes back to the front), and realtime work runs between its passes. Returns
        whether there were any, and the outcomes to store (for a job run in parts, the whole
        job's, once its last range ran)."""
        unfinished = []
        finished = list(outcomes)
        for i, (held, outcome) in enumerate(zip(batch, outcomes, strict=True)):
            if held.part is not None:
                finished[i] = self._part_run(held, outcome)
                if left_unfinished(finished[i]):
                    unfinished.append(held)
                continue
            if not left_unfinished(outcome):
                continue
            before = held.resume
            held.resume = Resume(
                state=outcome.result[RESUME],
                passes=(before.passes if before else 0) + 1,
                inference_ms=(before.inference_ms if before else 0.0) + outcome.inference_ms,
                started_at=before.started_at if before else outcome.started_at,
                stream_seq=outcome.result.get("stream_seq", 0),
                first_text_at=outcome.result.get("first_text_at"),
            )
            held.item = None  # sized again for its next pass
            unfinished.append(held)
        self.report.continued += len(unfinished)
        front = []
        for held in unfinished:
            tier = Tier(held.job.serving_tier or held.job.tier)
            if tier in WeightedShare.TIERS:
                # Sized again and charged to its tier when its turn comes (former.fill).
                self.line.wait_for_turn(held, tier)
            else:
                front.append(held)
        self.line.put_first(front)
        return bool(unfinished), finished

    @staticmethod
    def _part_run(held: Held, outcome: Outcome) -> Outcome:
        """One range of a job run in parts has run: kept until the last one, whose outcome
        is the whole job's (every range's embeddings, in input order). A failed range fails
        the job."""
        parts, (_, end) = held.parts, held.part
        held.part, held.item = None, None  # the next range is sized when its turn comes
        if outcome.result is None:
            return outcome
        parts.results.append(outcome.result["embeddings"])
        parts.done = end
        parts.inference_ms += outcome.inference_ms or 0.0
        parts.started_at = parts.started_at or outcome.started_at
        if end < len(parts.lengths):
            return replace(outcome, result={PART_RUN: True})
        return replace(
            outcome,
            result={**outcome.result, "embeddings": np.concatenate(parts.results)},
            started_at=parts.started_at,
            inference_ms=parts.inference_ms,
            tokens=sum(parts.lengths),
        )
