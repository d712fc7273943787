"""The GPU worker's loop: turns a delivered message into micro-batches, runs them, stores their
outcomes, acks messages — pipelined, so the model is not left waiting for the queue.

Called by the thin `inference.run_job` task with the job ids of one message. The seed jobs open
the first BatchWindow; the runner fills it from the service's tier queues (TierQueueReader:
realtime first, then weighted share) until it closes, claims the jobs atomically in Postgres,
and hands the batch to the model. While that forward pass runs (in a thread: torch releases
the GIL), the main thread forms and claims the next batch and the store thread writes the
previous one's outcomes; the forward passes themselves run one after another. The loop goes
on while work is waiting, for at most DRAIN_LIMIT_S, then the task returns and Celery acks
the seed.

Preemption happens between forward passes: before starting a batch of non-realtime work that
was formed during the previous pass, the runner looks for realtime work and runs it first. A
realtime job therefore waits for at most the batch already running, whose length the cost
model and the preemption budget bound (inference.scheduling.cost_model). A non-realtime
generation (an engine that is `resumable`: the LLM) longer than the budget runs in chunks of
decode steps: a pass that leaves it unfinished puts it back, still claimed and its message
unacked, at the front of the jobs waiting here, and a later pass continues it; only its final
outcome is stored.

A message is acked only once every job it carries has its outcome stored; on any error the
unacked messages go back to their queues, and their jobs' claims are taken over on redelivery.
The store thread only writes (in Postgres, on its own connection); the main thread acks, when
the write is done, on its own broker channel, and at most one write is in flight.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field, replace
from datetime import datetime

from django.conf import settings
from django.db import connections
from django.utils import timezone

from inference.config.changes import ConfigWatcher
from inference.delivery.streaming import TextRelay
from inference.dispatch.placement import (
    fail_over_local_error,
    record_local_throughput,
    settle_local_outcomes,
)
from inference.dispatch.publishing import dead_letter
from inference.engines import load_engine
from inference.engines.llm import RESUME
from inference.intake.lookups import RECHECK_INTERVAL_S
from inference.jobs.kinds import kind_of
from inference.jobs.tiers import Tier
from inference.jobs.transitions import Claim, Outcome
from inference.metrics import collector as metrics
from inference.metrics.log_fields import job_fields
from inference.models import Job, Service
from inference.scheduling.batch_window import BatchItem, BatchWindow
from inference.scheduling.cost_model import BatchCostModel, pass_target_s
from inference.workers import worker_identity
from inference.workers.cpu_pinning import pin_model_thread
from inference.workers.tier_reader import (
    BROKER_ERRORS,
    DEFAULT_WEIGHTS,
    PulledMessage,
    ReaderPool,
    WeightedShare,
)
from renq_site.db_sessions import close_old_connections_checked_once_a_second

logger = logging.getLogger(__name__)

# Between empty polls of the tier queues while a window is open. Small against batch_timeout
# (10 ms and up) yet cheap: each poll is one basic.get per tier on a local broker.
POLL_INTERVAL_S = 0.002
# One task keeps forming batches while work is waiting for at most this long (its seed message
# stays unacked meanwhile): far below the 300 s task limit and RabbitMQ's consumer_timeout.
DRAIN_LIMIT_S = 20.0
# The next batch is formed halfway through the running pass's predicted run, and at least this
# long before its predicted end: late enough that work arriving meanwhile is taken in priority
# order (tier, then plan) rather than in order of arrival, early enough that pulling, claiming
# and tokenizing it are done when the pass ends even when the prediction runs long. (Forming
# only 50 ms ahead left the model idle 17 % of a backlog drain: the cost model over-predicts
# by more than that, and forming 32 jobs under load takes 30-40 ms.) An early form that found
# nothing is repeated when the pass ends, so nothing arriving meanwhile waits for a new task.
FORM_AHEAD_S = 0.05
# One read of the service's cost model serves the loop this long (its own batches refresh it).
COST_MODEL_REUSE_S = 1.0
# Chunked decoding: the fewest decode steps a pass gives an unfinished generation, however
# small the budget, so that it always makes progress.
MIN_DECODE_STEPS = 8


# The configuration change marker, read before a batch at most as often as the web's caches do.
_settings_watcher = ConfigWatcher(min_interval_s=RECHECK_INTERVAL_S)

# Writes batches' outcomes while the main thread forms and claims the next batch: one per
# process, so the worker holds one more Postgres session, not one per task. (Storing on the
# main thread put each store between two claims: with a fast model the loop was a serial chain
# of broker and Postgres round trips, a quarter of it waiting for the store's UPDATE.)
_outcome_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")


def engine_payload(job: Job) -> dict:
    return kind_of(job.service.kind).engine_payload(job.service, job.input)


@dataclass
class BatchReport:
    """What one run did; returned by the task so Flower shows it."""

    ran: int = 0
    expired: int = 0
    dropped: int = 0
    failed: int = 0
    requeued: int = 0
    batches: int = 0
    continued: int = 0  # passes that left a generation unfinished, to continue in a later one
    seed_failed: bool = False
    tiers: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return self.__dict__.copy()


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
    item: BatchItem | None = None
    steps: int | None = None  # decode steps its next pass may take (None: to the end)
    resume: Resume | None = None


class MessageLedger:
    """Pulled messages and their unfinished jobs: a message is acked when all of them are
    stored, and every unacked one goes back to its queue if the run fails."""

    def __init__(self):
        self._waiting: dict[int, tuple[PulledMessage, set[str]]] = {}

    def track(self, pm: PulledMessage, job_ids: set[str]) -> None:
        self._waiting[id(pm)] = (pm, set(job_ids))

    def finished(self, job_ids: set[str]) -> list[PulledMessage]:
        """The messages whose every job is now finished (to ack)."""
        done = []
        for key, (pm, pending) in list(self._waiting.items()):
            pending -= job_ids
            if not pending:
                done.append(pm)
                del self._waiting[key]
        return done

    def unsettled(self) -> list[PulledMessage]:
        unsettled = [pm for pm, _ in self._waiting.values()]
        self._waiting.clear()
        return unsettled


@dataclass
class WindowPolls:
    """What one window's polls of the tier queues found. While a window waits for company,
    each poll asks realtime (a realtime job closes the window at once) and the tiers that gave
    it jobs; a tier below realtime found empty that gave it none is not asked again until the
    next window. Each ask is a broker round trip (an empty basic.get cost the worker and
    RabbitMQ 0.12 ms of CPU together, `bench/hot_path_pieces.py`), and under single-job load
    empty asks outnumbered messages, most of them of tiers with no work at all."""

    supplied: set[Tier] = field(default_factory=set)
    quiet: set[Tier] = field(default_factory=set)
    # The tiers the last pull asked and found empty.
    last_empty: list[Tier] = field(default_factory=list)

    def before_waiting(self) -> None:
        """The window waits for company: what the last pull found empty goes quiet."""
        self.quiet.update(
            t for t in self.last_empty if t != Tier.REALTIME and t not in self.supplied
        )


@dataclass
class Storing:
    """A batch whose finished outcomes the store thread is writing."""

    outcomes: list[Outcome]  # the whole pass's, for the statistics
    finished: list[Outcome]
    write: Future | None  # of write_outcomes; None when the pass finished no job


def write_outcomes(by_claim: list[tuple[Claim, list[Outcome]]]) -> list[Outcome]:
    """On the store thread: the outcomes of one batch, a claim's at a time (routed jobs'
    attempts recorded and failures handed on first). Returns what was stored."""
    # What the main thread's task start does for its connection: a session broken since
    # (a Postgres restart) is replaced here, not kept failing every later batch.
    close_old_connections_checked_once_a_second()
    stored = []
    for claim, outcomes in by_claim:
        settled = settle_local_outcomes(claim.token, outcomes, claim.route_backend_ids)
        Job.objects.store_outcomes(claim.token, settled)
        stored += settled
    return stored


def close_outcome_writer_connection() -> None:
    """Close the store thread's Postgres session (before the database it is on is dropped)."""
    _outcome_writer.submit(connections.close_all).result()


class BatchRunner:
    def __init__(self, readers: ReaderPool):
        self._readers = readers
        # One thread runs forward passes, one at a time; the task's thread feeds it.
        self._model_thread = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="forward", initializer=pin_model_thread
        )

    def run(
        self, seed_job_ids: list[str], *, seed_redelivered: bool, seed_tier: str | None
    ) -> dict:
        report = BatchReport()
        worker = worker_identity()
        seed_claim = Job.objects.claim(
            seed_job_ids,
            redelivered_ids=seed_job_ids if seed_redelivered else [],
            worker=worker,
        )
        self._note_claim(seed_claim, report)
        if not seed_claim.jobs:
            report.dropped += len(seed_job_ids) - len(seed_claim.expired)
            return report.as_dict()

        service = seed_claim.jobs[0].service
        try:
            engine = load_engine(service.kind, service.model_ref, device=settings.RENQ_DEVICE)
        except Exception as exc:
            # The local backend is down: a routed job moves down its cascade (routing/).
            for job in seed_claim.jobs:
                if not fail_over_local_error(seed_claim.token, job, exc):
                    raise
            report.failed += len(seed_claim.jobs)
            return report.as_dict()
        reader = self._readers.get(service.name)
        loop = _Drain(self, service, engine, reader, worker, report)
        for job in seed_claim.jobs:
            loop.hold(Held(job, seed_claim), Tier(seed_tier) if seed_tier else None)
        seed_ids = {str(job.pk) for job in seed_claim.jobs}
        try:
            loop.run()
        except BaseException:
            # Outcomes may not be stored: hand the pulled messages back now (redelivered, the
            # claim is taken over) rather than waiting for the stale-claim sweep.
            self._settle(service.name, loop.ledger.unsettled(), ack=False)
            raise
        report.seed_failed = bool(seed_ids & loop.failed_ids)
        return report.as_dict()

    @staticmethod
    def _note_claim(claim: Claim, report: BatchReport) -> None:
        report.expired += len(claim.expired)
        if claim.dead_lettered:
            dead_letter(claim.dead_lettered, "its workers were lost too many times")

    def _settle(self, service_name: str, messages: list[PulledMessage], *, ack: bool) -> None:
        try:
            for pm in messages:
                if not pm.message.acknowledged:
                    pm.message.ack() if ack else pm.message.requeue()
        except BROKER_ERRORS:
            # A dead channel gives its unacked messages back to RabbitMQ by itself; their
            # redelivery finds the jobs finished (or takes the claim over) in Postgres.
            logger.warning("could not settle %d pulled messages", len(messages), exc_info=True)
            self._readers.discard(service_name)

    def infer(self, engine, jobs: list[Job], tokens: list[int], plans=None) -> Future:
        return self._model_thread.submit(forward_pass, engine, jobs, tokens, plans)


class _Drain:
    """One run of the loop (see the module's docstring)."""

    def __init__(self, runner: BatchRunner, service: Service, engine, reader, worker, report):
        self.runner = runner
        self.service = service
        self.engine = engine
        self.reader = reader
        self.worker = worker
        self.report = report
        # The front of the line: claimed realtime jobs, generations to continue, a formed
        # batch that yielded to realtime work. They run before anything else.
        self.pending: deque[Held] = deque()
        # Claimed jobs of the tiers below realtime that did not fit the batch they were
        # pulled for: they wait for their tier's turn in the weighted share, which charges
        # them when they run, so the jobs of one message do not run back to back ahead of
        # the other tiers' work.
        self.waiting: dict[Tier, deque[Held]] = {tier: deque() for tier in WeightedShare.TIERS}
        self.share = reader.share if reader is not None else WeightedShare(DEFAULT_WEIGHTS)
        self.ledger = MessageLedger()
        self.failed_ids: set[str] = set()
        # One per task: a task starts from what every worker has stored (a model kept across
        # tasks answered from its last read, up to COST_MODEL_REUSE_S old, and a chunked
        # generation started on a stale prediction ran in one pass).
        self.cost_model = BatchCostModel(service.name, engine.device, reuse_s=COST_MODEL_REUSE_S)
        self.padding = getattr(engine, "max_padding_ratio", 0.0)
        self.max_run_s = pass_target_s(service)
        self.pull_until = time.monotonic() + DRAIN_LIMIT_S
        self.started_at = 0.0
        self.storing: Storing | None = None

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self.drain()
        finally:
            # The last batch's outcomes are stored and its messages acked before the task
            # returns, or, after an error, before the unacked rest go back to their queues.
            self.stored()

    def drain(self) -> None:
        # A realtime seed starts its pass at once: realtime work waiting beside it is pulled
        # while that pass runs, for the next one. At idle there is none, and looking for it
        # first put a broker round trip and a cost-model read between claim and pass.
        realtime_seed = any(held.job.tier == Tier.REALTIME for held in self.pending)
        batch = self.form(company=not realtime_seed)
        running: tuple[list[Held], Future] | None = None
        if batch:
            running = (batch, self.start(batch))
        while running is not None:
            held, future = running
            # While the model runs: form and claim the next batch, as late as the pass allows,
            # so what arrives meanwhile is ordered by tier and plan, not by arrival.
            self.wait_until_due(held, future)
            upcoming = self.form() if self.holding or self.pulling else []
            formed_at = time.monotonic()
            outcomes = self.wait(held, future)
            unfinished = self.carry_on(held, outcomes)
            if not upcoming and (
                unfinished or (self.pulling and time.monotonic() - formed_at > FORM_AHEAD_S)
            ):
                upcoming = self.form()  # what it left unfinished; what arrived since the form
            upcoming = self.realtime_first(upcoming)
            running = (upcoming, self.start(upcoming)) if upcoming else None
            # While the next batch runs: this one's outcomes go to the store thread (once the
            # one before is stored and its finished messages acked).
            self.store(held, outcomes)

    def wait_until_due(self, batch: list[Held], future: Future) -> None:
        """Until halfway through the running pass's predicted run, at the latest FORM_AHEAD_S
        before its predicted end (or until it ends)."""
        predicted_s = self.cost_model.current().predict_s(
            sum(h.item.tokens for h in batch), padding_ratio=self.padding
        )
        form_after_s = min(predicted_s / 2, predicted_s - FORM_AHEAD_S)
        due_in_s = self.started_at + form_after_s - time.monotonic()
        if due_in_s > 0:
            wait_futures([future], timeout=due_in_s)

    @property
    def pulling(self) -> bool:
        return self.reader is not None and time.monotonic() < self.pull_until

    @property
    def holding(self) -> bool:
        """Claimed jobs wait here to run (they are run before the task returns)."""
        return bool(self.pending) or any(self.waiting.values())

    def hold(self, held: Held, tier: Tier | None) -> None:
        """A claimed job that is not running yet: realtime work and jobs of no tier queue
        (bulk pieces) at the end of the front of the line, the others by their tier queue."""
        if tier in self.waiting and not self.item(held).realtime:
            self.waiting[tier].append(held)
        else:
            self.pending.append(held)

    def start(self, batch: list[Held]) -> Future:
        self.report.batches += 1
        self.started_at = time.monotonic()
        plans = [(h.steps, h.resume) for h in batch]
        return self.runner.infer(
            self.engine,
            [h.job for h in batch],
            [h.item.tokens for h in batch],
            plans if any(steps or resume for steps, resume in plans) else None,
        )

    def wait(self, batch: list[Held], future: Future) -> list[Outcome]:
        limit_s = self.service.inference_timeout
        started_at = timezone.now()
        try:
            return future.result(timeout=limit_s if limit_s > 0 else None)
        except FutureTimeout:
            # The attempt is over for the jobs (a routed job moves down its cascade); the
            # pass itself cannot be interrupted, so the next one starts after it ends.
            logger.warning("batch of %d exceeded inference_timeout %g s", len(batch), limit_s)
            future.exception()  # wait for the model thread to be free again
            error = f"the forward pass exceeded the service's inference_timeout ({limit_s:g} s)"
            return [Outcome(job=h.job, error=error, started_at=started_at) for h in batch]

    def carry_on(self, batch: list[Held], outcomes: list[Outcome]) -> bool:
        """Generations the pass left unfinished go back to the front of the line, claimed,
        to continue after whatever realtime work arrived meanwhile. True if there were any."""
        unfinished = []
        for held, outcome in zip(batch, outcomes, strict=True):
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
        self.pending.extendleft(reversed(unfinished))
        return bool(unfinished)

    def realtime_first(self, upcoming: list[Held]) -> list[Held]:
        """A batch formed during the previous pass yields to realtime work that arrived
        since: its jobs stay claimed and go back to the front of the line."""
        # Also after the drain limit, while claimed jobs are still being run.
        if not upcoming or any(h.item.realtime for h in upcoming):
            return upcoming
        realtime = self.form(only_realtime=True, pull=True)
        if not realtime:
            return upcoming
        self.pending.extendleft(reversed(upcoming))
        return realtime

    # --- forming a batch --------------------------------------------------------------------

    def new_window(self) -> BatchWindow:
        if _settings_watcher.changed():
            # Runtime settings take effect on the next batch, also inside a long loop.
            fresh = Service.objects.filter(name=self.service.name).first()
            if fresh is not None:
                self.service = fresh
                self.max_run_s = pass_target_s(fresh)
        return BatchWindow(
            max_jobs=self.service.batch_size,
            timeout_s=self.service.batch_timeout,
            max_tokens=self.service.max_total_tokens,
            max_run_s=self.max_run_s,
            # Read when a prediction is first needed (a Redis round trip, then reused for
            # COST_MODEL_REUSE_S): a realtime seed's first window needs none.
            predict_s=lambda tokens: self.cost_model.current().predict_s(
                tokens, padding_ratio=self.padding
            ),
        )

    def item(self, held: Held, tokens: int | None = None) -> BatchItem:
        """The held job as the window sizes it (`tokens`: its count_tokens, if known)."""
        if held.item is None:
            payload = engine_payload(held.job)
            if held.resume is not None:
                payload = {**payload, RESUME: held.resume.state}
            realtime = held.job.tier == Tier.REALTIME
            if tokens is None:
                tokens = self.engine.count_tokens(payload)
            held.steps = None if realtime else self.decode_steps(payload, tokens)
            if held.steps is not None:
                tokens = self.engine.decode_progress(payload)[0] + held.steps
            held.item = BatchItem(value=held, tokens=tokens, realtime=realtime)
        return held.item

    def decode_steps(self, payload: dict, tokens: int) -> int | None:
        """Chunked decoding: the decode steps a non-realtime generation may take in one pass,
        so that the pass (prompt + tokens generated so far + these steps) is predicted to fit
        the preemption budget; None when the rest of it fits."""
        if not getattr(self.engine, "resumable", False):
            return None
        cost = self.cost_model.current()
        limit = cost.tokens_within(self.max_run_s, padding_ratio=self.padding)
        if tokens <= limit:
            return None
        context, left = self.engine.decode_progress(payload)
        steps = max(MIN_DECODE_STEPS, limit - context)
        return steps if steps < left else None

    def form(
        self, *, only_realtime: bool = False, pull: bool = False, company: bool = True
    ) -> list[Held]:
        """The front of the line first, then claimed jobs and the tier queues by the weighted
        share, until the window closes. Past the drain limit only claimed jobs are formed,
        unless `pull` (realtime work); without `company`, only the front of the line."""
        window = self.new_window()
        while self.pending:
            held = self.pending[0]
            if only_realtime and not self.item(held).realtime:
                break  # claimed realtime jobs wait at the front of the line (see admit)
            if not window.offer(self.item(held), arrived_at=held.job.created_at.timestamp()):
                break
            self.pending.popleft()
        may_pull = company and (self.pulling or (pull and self.reader is not None))
        try:
            self.fill(window, only_realtime=only_realtime, may_pull=may_pull)
        except BROKER_ERRORS:
            # The broker went away mid-batch: run what the window holds; a fresh
            # connection opens for the next task. Pulled messages return to their queues
            # when the broken channel closes; their jobs' outcomes are stored anyway.
            logger.warning("broker connection lost while forming a batch", exc_info=True)
            self.runner._readers.discard(self.service.name)
            self.reader = None
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
            pulled = self.pull(window, realtime=realtime, polls=polls) if may_pull else []
            if pulled:
                polls.supplied.update(pm.tier for pm in pulled)
                self.admit(pulled, window)
                continue
            if not realtime and any(self.waiting.values()):
                # Nothing queued in the tiers ahead of it: the first tier in the share's
                # order with claimed jobs waiting here runs one.
                if not self.take_waiting(window):
                    return
                continue
            if not may_pull or not window.items or window.should_close():
                return
            polls.before_waiting()
            time.sleep(min(POLL_INTERVAL_S, window.remaining_s()))

    def tiers_ahead_of_waiting(self) -> list[Tier]:
        """Realtime, then the tiers below it in the share's order up to the first one with
        claimed jobs waiting here: the queues to pull from before those jobs run."""
        ahead = [Tier.REALTIME]
        for tier in self.share.order():
            if self.waiting[tier]:
                break
            ahead.append(tier)
        return ahead

    def take_waiting(self, window: BatchWindow) -> bool:
        """Offer the next claimed job of the first tier (in the share's order) that has any;
        charge its tier when it is taken. False when it does not fit: the window is done."""
        tier = next(t for t in self.share.order() if self.waiting[t])
        held = self.waiting[tier][0]
        if not window.offer(self.item(held), arrived_at=held.job.created_at.timestamp()):
            return False
        self.waiting[tier].popleft()
        self.share.served(tier, 1)
        return True

    def pull(
        self, window: BatchWindow, *, realtime: bool, polls: WindowPolls | None = None
    ) -> list[PulledMessage]:
        """As many waiting messages as the window is likely to take, to claim together: one
        claim per batch instead of one per message (each is a Postgres round trip between
        forward passes). Realtime first; below it, only the queues of tiers whose turn comes
        before claimed jobs waiting here. Stops at a realtime message, which changes what
        the window takes."""
        pulled: list[PulledMessage] = []
        room = max(1, window.likely_room())
        jobs = 0
        # Queues found empty in this pull are not asked again until the next one (each ask is
        # a round trip: asking the realtime queue before every message doubled them). Realtime
        # work arriving meanwhile is found before the batch starts (realtime_first).
        empty: set[Tier] = set(polls.quiet) if polls is not None else set()
        while jobs < room:
            tiers = [Tier.REALTIME] if realtime else self.tiers_ahead_of_waiting()
            tiers = [tier for tier in tiers if tier not in empty]
            pm = self.reader.get(tiers) if tiers else None
            if pm is None:
                if polls is not None:
                    polls.last_empty = tiers
                break
            pulled.append(pm)
            jobs += len(pm.job_ids)
            if pm.tier == Tier.REALTIME and not realtime:
                break
            empty.update(tiers[: tiers.index(pm.tier)])
            if pm.left_in_queue == 0:
                empty.add(pm.tier)
        return pulled

    def admit(self, pulled: list[PulledMessage], window: BatchWindow) -> None:
        try:
            claim = Job.objects.claim(
                [job_id for pm in pulled for job_id in pm.job_ids],
                redelivered_ids=[i for pm in pulled if pm.redelivered for i in pm.job_ids],
                worker=self.worker,
            )
        except BaseException:
            # Not in the ledger yet, so the run's failure handler would not hand them back:
            # they would stay unacked on this reader's live channel until the lost-message sweep.
            self.runner._settle(self.service.name, pulled, ack=False)
            raise
        self.runner._note_claim(claim, self.report)
        claimed_ids = {str(job.pk) for job in claim.jobs}
        tier_of: dict[str, Tier] = {}
        for pm in pulled:
            mine = claimed_ids.intersection(pm.job_ids)
            if self.reader is not None:
                self.reader.claimed(pm, len(mine))
            if mine:
                self.ledger.track(pm, mine)
                tier_of.update(dict.fromkeys(mine, pm.tier))
            else:
                # Duplicates, cancelled, expired or finished jobs: nothing to run.
                self.runner._settle(self.service.name, [pm], ack=True)
        realtime_left: list[Held] = []
        claimed = [Held(job, claim) for job in claim.jobs]
        # Sized once, all in one tokenizer call (one call per job cost this thread more than
        # the tokenizing; every ms here is GIL time taken from the running pass). A job that
        # waits here keeps its size.
        counts = self.engine.count_tokens_many([engine_payload(job) for job in claim.jobs])
        for held, tokens in zip(claimed, counts, strict=True):
            item = self.item(held, tokens)
            job = held.job
            if window.full or not window.offer(item, arrived_at=job.created_at.timestamp()):
                # What does not fit waits here, claimed: a realtime job at the front of the
                # line, where realtime_first finds it; the others for their tier's turn,
                # which is charged when they run, not now.
                tier = tier_of[str(job.pk)]
                if item.realtime:
                    realtime_left.append(held)
                else:
                    self.share.corrected(tier, -1)
                    self.hold(held, tier)
        self.pending.extendleft(reversed(realtime_left))

    # --- storing ----------------------------------------------------------------------------

    def store(self, batch: list[Held], outcomes: list[Outcome]) -> None:
        """Hand the pass's finished outcomes to the store thread. The cost model learns from
        the pass now, once the write is under way (its update is a Redis round trip that held
        up an idle realtime job's result): the next batches are sized on it."""
        self.report.tiers = sorted(set(self.report.tiers) | {h.job.tier for h in batch})
        self.stored()
        # Generations left unfinished went back to the line (carry_on); the rest are stored,
        # with what their earlier passes took.
        finished = [
            (held, self.whole(held, outcome))
            for held, outcome in zip(batch, outcomes, strict=True)
            if not left_unfinished(outcome)
        ]
        by_claim: dict = {}
        for held, outcome in finished:
            if outcome.result and "first_token_ms" in outcome.result:
                metrics.observe_time_to_first_token(
                    self.service.name, outcome.result["first_token_ms"] / 1000
                )
            by_claim.setdefault(held.claim.token, (held.claim, []))[1].append(outcome)
        write = (
            _outcome_writer.submit(write_outcomes, list(by_claim.values())) if finished else None
        )
        self.storing = Storing(outcomes, [outcome for _, outcome in finished], write)
        if outcomes[0].inference_ms is not None and outcomes[0].batch_size == len(batch):
            self.cost_model.observe_batch(
                outcomes[0].inference_ms / 1000, sum(o.tokens for o in outcomes)
            )

    def stored(self) -> None:
        """Wait for the batch being stored (its error raises here), then ack the messages
        whose every job is now stored and count the batch."""
        storing, self.storing = self.storing, None
        if storing is None:
            return
        if storing.write is not None:
            stored = storing.write.result()
            dead = [o.job.pk for o in stored if o.result is None and o.dead_letter]
            if dead:
                dead_letter(dead, "the model raised on this job's input")
            report = self.report
            report.ran += sum(o.result is not None for o in storing.finished)
            report.failed += sum(o.result is None for o in storing.finished)
            self.failed_ids |= {str(o.job.pk) for o in storing.finished if o.result is None}
            # Outcomes are stored: only now may RabbitMQ forget the messages.
            acked = self.ledger.finished({str(o.job.pk) for o in storing.finished})
            self.runner._settle(self.service.name, acked, ack=True)
        # Statistics after the outcomes: a job is finished before its batch is counted.
        metrics.observe_batch(self.service, storing.outcomes)
        record_local_throughput(storing.outcomes)

    def whole(self, held: Held, outcome: Outcome) -> Outcome:
        """The outcome of a generation over all of its passes (its last one's otherwise)."""
        if held.resume is None:
            return outcome
        payload = {**engine_payload(held.job), RESUME: held.resume.state}
        return replace(
            outcome,
            started_at=held.resume.started_at or outcome.started_at,
            inference_ms=None
            if outcome.inference_ms is None
            else held.resume.inference_ms + outcome.inference_ms,
            # As if run at once: prompt + its whole budget, the tokens an attempt records.
            tokens=self.engine.count_tokens(payload),
        )


def left_unfinished(outcome: Outcome) -> bool:
    """The pass stopped this generation early (chunked decoding): its result is the engine's
    state to continue from, not an outcome to store."""
    return outcome.result is not None and RESUME in outcome.result


def forward_pass(
    engine, jobs: list[Job], tokens: list[int], plans: list[tuple] | None = None
) -> list[Outcome]:
    """Run the jobs together (in the model thread); one outcome per job, in order.

    `plans`, for chunked decoding: per job (decode steps this pass may take or None, the
    Resume of a generation that continues or None). A job the pass leaves unfinished has
    the engine's state as its result, under RESUME."""
    started_at = timezone.now()
    started = time.perf_counter()
    payloads = [engine_payload(job) for job in jobs]
    resumed = {i: resume for i, (_, resume) in enumerate(plans or []) if resume is not None}
    for i, resume in resumed.items():
        payloads[i] = {**payloads[i], RESUME: resume.state}
    kwargs = {}
    if plans is not None:
        kwargs["max_steps"] = [steps for steps, _ in plans]
    relay = None
    if any(payload.get("stream") for payload in payloads):
        # Generated text goes out as it is produced (inference.delivery.streaming).
        relay = TextRelay(
            {i: job.pk for i, job in enumerate(jobs)},
            sequence={i: r.stream_seq for i, r in resumed.items()},
            first_text_at={i: r.first_text_at for i, r in resumed.items() if r.first_text_at},
        )
        kwargs["on_text"] = relay
    try:
        results = engine.run_batch(payloads, **kwargs)
    except Exception as exc:
        if len(jobs) == 1:
            logger.exception("job %s failed", jobs[0].pk, extra=job_fields(jobs[0]))
            # Alone, it still fails: its input is the cause. A verdict, not a crash.
            return [
                Outcome(
                    job=jobs[0],
                    error=f"{type(exc).__name__}: {exc}",
                    started_at=started_at,
                    dead_letter=True,
                )
            ]
        # One bad input must not fail its neighbours: run each alone to find it.
        logger.exception("batch of %d failed; isolating", len(jobs), extra=job_fields(jobs[0]))
        return [
            outcome
            for i, (job, n) in enumerate(zip(jobs, tokens, strict=True))
            for outcome in forward_pass(engine, [job], [n], plans and [plans[i]])
        ]
    elapsed_ms = (time.perf_counter() - started) * 1000
    if relay is not None:
        for index, first_at in relay.first_text_at.items():
            if RESUME in results[index]:
                # Where its stream goes on in the next pass.
                results[index] = {
                    **results[index],
                    "stream_seq": relay.sequence.get(index, 0),
                    "first_text_at": first_at,
                }
                continue
            # Time to first token, from submission: queue wait plus prefill plus one step.
            ttft_ms = (first_at - jobs[index].created_at.timestamp()) * 1000
            results[index] = {**results[index], "first_token_ms": round(ttft_ms, 3)}
    return [
        Outcome(
            job=job,
            result=result,
            started_at=started_at,
            inference_ms=elapsed_ms,
            batch_size=len(jobs),
            tokens=n,
        )
        for job, result, n in zip(jobs, results, tokens, strict=True)
    ]
