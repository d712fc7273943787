"""Forming the next batch: the front of the line first, then claimed jobs and the tier queues
by the weighted share, into a BatchWindow sized by the service's cost model.

Each job is sized once (its tokens, and for chunked decoding the decode steps its next pass
may take) so that a pass is predicted to fit the preemption budget.
"""

from __future__ import annotations

import logging
import time

from inference.config.changes import ConfigWatcher
from inference.intake.lookups import RECHECK_INTERVAL_S
from inference.jobs.tiers import Tier
from inference.models import Service
from inference.scheduling.batch_window import BatchItem, BatchWindow
from inference.scheduling.cost_model import BatchCostModel, pass_target_s
from inference.workers.gpu.held import Held, Parts, engine_payload
from inference.workers.gpu.intake import Intake, WindowPolls
from inference.workers.gpu.line import Line
from inference.workers.tier_reader import BROKER_ERRORS, PulledMessage, WeightedShare

logger = logging.getLogger(__name__)

# Between empty polls of the tier queues while a window is open. Small against batch_timeout
# (10 ms and up) yet cheap: each poll is one basic.get per tier on a local broker.
POLL_INTERVAL_S = 0.002
# Chunked decoding: the fewest decode steps a pass gives an unfinished generation, however
# small the budget, so that it always makes progress.
MIN_DECODE_STEPS = 8

# The configuration change marker, read before a batch at most as often as the web's caches do.
_settings_watcher = ConfigWatcher(min_interval_s=RECHECK_INTERVAL_S)


class BatchFormer:
    """Forms one run's batches. `service` is re-read when runtime settings change: they take
    effect on the next batch, also inside a long loop."""

    def __init__(
        self, service: Service, engine, cost_model: BatchCostModel, *, line: Line, intake: Intake
    ):
        self.service = service
        self._engine = engine
        self._cost_model = cost_model
        self._padding = getattr(engine, "max_padding_ratio", 0.0)
        self._max_run_s = pass_target_s(service)
        self._line = line
        self._intake = intake

    def predict_s(self, tokens: int) -> float:
        """How long a pass of this many tokens is predicted to run."""
        return self._cost_model.current().predict_s(tokens, padding_ratio=self._padding)

    def hold(self, held: Held, tier: Tier | None) -> None:
        """A claimed job that is not running yet joins the line: realtime work (and a job whose
        tier queue is unknown) at the end of the front, the others (sized now) by their tier
        queue, for its turn."""
        if tier in WeightedShare.TIERS and not self.item(held).realtime:
            self._line.wait_for_turn(held, tier)
        else:
            self._line.front.append(held)

    def form(
        self, *, only_realtime: bool = False, pull: bool = False, company: bool = True
    ) -> list[Held]:
        """The front of the line first, then claimed jobs and the tier queues by the weighted
        share, until the window closes. Past the drain limit only claimed jobs are formed,
        unless `pull` (realtime work); without `company`, only the front of the line."""
        window = self.new_window()
        front = self._line.front
        while front:
            held = front[0]
            if only_realtime and not self.item(held).realtime:
                break  # claimed realtime jobs wait at the front of the line (see admit)
            if not window.offer(self.item(held), arrived_at=held.job.created_at.timestamp()):
                break
            front.popleft()
        intake = self._intake
        may_pull = company and (intake.pulling or (pull and intake.reader is not None))
        try:
            self.fill(window, only_realtime=only_realtime, may_pull=may_pull)
        except BROKER_ERRORS:
            # The broker went away mid-batch: run what the window holds; a fresh
            # connection opens for the next task. Pulled messages return to their queues
            # when the broken channel closes; their jobs' outcomes are stored anyway.
            logger.warning("broker connection lost while forming a batch", exc_info=True)
            intake.reader_lost()
            # The jobs already claimed still run, without pulling: dropped with the window
            # (a seed held for its tier's turn, say), a job stayed running until the
            # stale-claim sweep.
            self.fill(window, only_realtime=only_realtime, may_pull=False)
        return [item.value for item in window.items]

    def fill(self, window: BatchWindow, *, only_realtime: bool, may_pull: bool) -> None:
        """Take what is waiting now, always; wait for more only while the window is open.

        Below realtime, each tier's turn comes by the weighted share: the tier whose turn it
        is runs its claimed jobs waiting here if it has any, else the loop pulls from its
        queue (or the next tier's, when that queue is empty). The deadline bounds how long a
        batch waits for company, never what it takes: under a backlog every job is past its
        deadline, and the batch must still fill from the queue.
        """
        polls = WindowPolls()
        while not window.full:
            # A realtime batch takes only other realtime jobs: P0 never waits behind a big
            # batch of offline work in its own forward pass.
            realtime = only_realtime or window.has_realtime
            if not realtime and window.items and window.likely_room() == 0:
                # Nothing more is predicted to fit: a job claimed now would only wait here.
                return
            pulled = self._intake.pull(window, realtime=realtime, polls=polls) if may_pull else []
            if pulled:
                polls.supplied.update(pm.tier for pm in pulled)
                if not self.admit(pulled, window) and window.items and window.should_close():
                    # Only jobs that ended at their claim (expired, cancelled, duplicates):
                    # a queue full of them must not keep a due batch from running.
                    return
                continue
            if not realtime and self._line.tiers_waiting:
                # Nothing queued in the tiers ahead of it: the first tier in the share's
                # order with claimed jobs waiting here runs one.
                if not self._take_waiting(window):
                    return
                continue
            if not may_pull or not window.items or window.should_close():
                return
            polls.before_waiting()
            time.sleep(min(POLL_INTERVAL_S, window.remaining_s()))

    def admit(self, pulled: list[PulledMessage], window: BatchWindow) -> int:
        """Claim the pulled messages' jobs and offer them to the window. What does not fit
        waits here, claimed: a realtime job at the front of the line, where realtime_first
        finds it; the others for their tier's turn, which is charged when they run, not now.
        Returns how many jobs were claimed to run."""
        claimed = self._intake.claim(pulled)
        realtime_left: list[Held] = []
        # Sized once, all in one tokenizer call: every ms here is GIL time taken from the
        # running pass. A job that waits here keeps its size.
        counts = self._engine.count_tokens_many([engine_payload(held.job) for held, _ in claimed])
        for (held, tier), tokens in zip(claimed, counts, strict=True):
            item = self.item(held, tokens)
            if window.full or not window.offer(item, arrived_at=held.job.created_at.timestamp()):
                if item.realtime:
                    realtime_left.append(held)
                else:
                    self._line.share.corrected(tier, -1)
                    self.hold(held, tier)
        self._line.put_first(realtime_left)
        return len(claimed)

    def new_window(self) -> BatchWindow:
        if _settings_watcher.changed():
            fresh = Service.objects.filter(name=self.service.name).first()
            if fresh is not None:
                self.service = fresh
                self._max_run_s = pass_target_s(fresh)
        return BatchWindow(
            max_jobs=self.service.batch_size,
            timeout_s=self.service.batch_timeout,
            max_tokens=self.service.max_total_tokens,
            max_run_s=self._max_run_s,
            # Read when a prediction is first needed (a Redis round trip, then reused): a
            # realtime seed's first window needs none.
            predict_s=self.predict_s,
        )

    def item(self, held: Held, tokens: int | None = None) -> BatchItem:
        """The held job as the window sizes it (`tokens`: its count_tokens, if known)."""
        if held.item is None:
            payload = held.resumed_payload()
            realtime = held.job.tier == Tier.REALTIME
            if tokens is None:
                tokens = self._engine.count_tokens(payload)
            held.steps = None if realtime else self._decode_steps(payload, tokens)
            if held.steps is not None:
                tokens = self._engine.decode_progress(payload)[0] + held.steps
            # One text is one part: its job needs no cost-model read (a Redis round trip
            # between an idle realtime job's claim and its pass) to find that out.
            if held.parts is not None or (
                getattr(self._engine, "runs_in_parts", False)
                and len(payload.get("texts", ())) > 1
                and tokens > self._pass_tokens()
            ):
                tokens = self._next_part(held, payload)
            held.item = BatchItem(value=held, tokens=tokens, realtime=realtime)
        return held.item

    def _pass_tokens(self) -> int:
        """The most tokens one pass may hold: the batch's token budget, and what the cost
        model says runs within the run budget and half the inference_timeout."""
        service = self.service
        budget_s = self._max_run_s
        if service.inference_timeout > 0:
            budget_s = min(budget_s, service.inference_timeout / 2)
        within = self._cost_model.current().tokens_within(budget_s, padding_ratio=self._padding)
        return min(service.max_total_tokens, within) if within > 0 else service.max_total_tokens

    def _next_part(self, held: Held, payload: dict) -> int:
        """A job too large for one pass runs in parts: the next range of its texts that fits
        one pass (at least one text). Returns the range's tokens."""
        if held.parts is None:
            texts = payload["texts"]
            held.parts = Parts(self._engine.count_tokens_many([{"texts": [t]} for t in texts]))
        lengths, start = held.parts.lengths, held.parts.done
        limit, end, tokens = self._pass_tokens(), start, 0
        while end < len(lengths) and (end == start or tokens + lengths[end] <= limit):
            tokens += lengths[end]
            end += 1
        held.part = (start, end)
        return tokens

    def _take_waiting(self, window: BatchWindow) -> bool:
        """Offer the next claimed job of the first tier (in the share's order) that has any;
        charge its tier when it is taken. False when it does not fit: the window is done."""
        tier, held = self._line.next_waiting()
        if not window.offer(self.item(held), arrived_at=held.job.created_at.timestamp()):
            return False
        self._line.take_waiting(tier)
        return True

    def _decode_steps(self, payload: dict, tokens: int) -> int | None:
        """Chunked decoding: the decode steps a non-realtime generation may take in one pass,
        so that the pass (prompt + tokens generated so far + these steps) is predicted to fit
        the preemption budget; None when the rest of it fits."""
        if not getattr(self._engine, "resumable", False):
            return None
        cost = self._cost_model.current()
        limit = cost.tokens_within(self._max_run_s, padding_ratio=self._padding)
        if tokens <= limit:
            return None
        context, left = self._engine.decode_progress(payload)
        steps = max(MIN_DECODE_STEPS, limit - context)
        return steps if steps < left else None
