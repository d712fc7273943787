"""The GPU worker's loop: turns a delivered message into micro-batches, runs them, stores their
outcomes, acks messages — pipelined, so the model is not left waiting for the queue.

Called by the thin `inference.run_job` task with the job ids of one message. The seed jobs open
the first BatchWindow; the runner fills it from the service's tier queues (TierQueueReader:
realtime first, then weighted share) until it closes, claims the jobs atomically in Postgres,
and hands the batch to the model. While that forward pass runs (in a thread: torch releases
the GIL), the main thread forms and claims the next batch and stores the previous one's
outcomes; the forward passes themselves run one after another. The loop goes on while work
is waiting, for at most DRAIN_LIMIT_S, then the task returns and Celery acks the seed.

Preemption happens between forward passes: before starting a batch of non-realtime work that
was formed during the previous pass, the runner looks for realtime work and runs it first. A
realtime job therefore waits for at most the batch already running, whose length the cost
model and the preemption budget bound (inference.cost_model).

A message is acked only once every job it carries has its outcome stored; on any error the
unacked messages go back to their queues, and their jobs' claims are taken over on redelivery.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from inference import metrics
from inference.batching import BatchItem, BatchWindow
from inference.config.changes import ConfigWatcher
from inference.cost_model import BatchCostModel, preemption_budget_s
from inference.engines import load_engine
from inference.kinds import kind_of
from inference.log_fields import job_fields
from inference.lookups import RECHECK_INTERVAL_S
from inference.models import Job, Service
from inference.placement import fail_over_local_error, settle_local_outcomes
from inference.publishing import dead_letter
from inference.streaming import TextRelay
from inference.tiers import Tier
from inference.transitions import Claim, Outcome
from inference.workers import worker_identity
from inference.workers.tier_reader import BROKER_ERRORS, PulledMessage, ReaderPool

logger = logging.getLogger(__name__)

# Between empty polls of the tier queues while a window is open. Small against batch_timeout
# (10 ms and up) yet cheap: each poll is one basic.get per tier on a local broker.
POLL_INTERVAL_S = 0.002
# One task keeps forming batches while work is waiting for at most this long (its seed message
# stays unacked meanwhile): far below the 300 s task limit and RabbitMQ's consumer_timeout.
DRAIN_LIMIT_S = 20.0
# The next batch is formed this long before the running pass is predicted to end: enough to
# pull, claim and tokenize it, late enough that work arriving meanwhile is taken in priority
# order (tier, then plan) rather than in order of arrival.
FORM_AHEAD_S = 0.05


# The configuration change marker, read before a batch at most as often as the web's caches do.
_settings_watcher = ConfigWatcher(min_interval_s=RECHECK_INTERVAL_S)


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
    seed_failed: bool = False
    tiers: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return self.__dict__.copy()


@dataclass
class Held:
    """A job this worker has claimed and not yet run."""

    job: Job
    claim: Claim
    item: BatchItem | None = None


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


class BatchRunner:
    def __init__(self, readers: ReaderPool):
        self._readers = readers
        # One thread runs forward passes, one at a time; the task's thread feeds it.
        self._model_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forward")

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
        if reader is not None and seed_tier:
            reader.share.served(Tier(seed_tier))

        loop = _Drain(self, service, engine, reader, worker, report)
        loop.pending.extend(Held(job, seed_claim) for job in seed_claim.jobs)
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

    def infer(self, engine, jobs: list[Job], tokens: list[int]) -> Future:
        return self._model_thread.submit(forward_pass, engine, jobs, tokens)


class _Drain:
    """One run of the loop (see the module's docstring)."""

    def __init__(self, runner: BatchRunner, service: Service, engine, reader, worker, report):
        self.runner = runner
        self.service = service
        self.engine = engine
        self.reader = reader
        self.worker = worker
        self.report = report
        self.pending: deque[Held] = deque()
        self.ledger = MessageLedger()
        self.failed_ids: set[str] = set()
        self.cost_model = BatchCostModel(service.name, engine.device)
        self.padding = getattr(engine, "max_padding_ratio", 0.0)
        self.budget_s = preemption_budget_s(service)
        self.pull_until = time.monotonic() + DRAIN_LIMIT_S
        self.started_at = 0.0

    # --- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        batch = self.form()
        running: tuple[list[Held], Future] | None = None
        if batch:
            running = (batch, self.start(batch))
        while running is not None:
            held, future = running
            # While the model runs: form and claim the next batch, as late as the pass allows,
            # so what arrives meanwhile is ordered by tier and plan, not by arrival.
            self.wait_until_due(held, future)
            upcoming = self.form() if self.pending or self.pulling else []
            outcomes = self.wait(held, future)
            upcoming = self.realtime_first(upcoming)
            running = (upcoming, self.start(upcoming)) if upcoming else None
            # While the next batch runs: store this one's outcomes, ack finished messages.
            self.store(held, outcomes)

    def wait_until_due(self, batch: list[Held], future: Future) -> None:
        """Until FORM_AHEAD_S before the running pass is predicted to end (or it ends)."""
        predicted_s = self.cost_model.current().predict_s(
            sum(h.item.tokens for h in batch), padding_ratio=self.padding
        )
        due_in_s = self.started_at + predicted_s - FORM_AHEAD_S - time.monotonic()
        if due_in_s > 0:
            wait_futures([future], timeout=due_in_s)

    @property
    def pulling(self) -> bool:
        return self.reader is not None and time.monotonic() < self.pull_until

    def start(self, batch: list[Held]) -> Future:
        self.report.batches += 1
        self.started_at = time.monotonic()
        return self.runner.infer(
            self.engine, [h.job for h in batch], [h.item.tokens for h in batch]
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

    def realtime_first(self, upcoming: list[Held]) -> list[Held]:
        """A batch formed during the previous pass yields to realtime work that arrived
        since: its jobs stay claimed and go back to the front of the line."""
        # Also after the drain limit, while claimed jobs are still being run.
        if not upcoming or any(h.item.realtime for h in upcoming) or self.reader is None:
            return upcoming
        realtime = self.form(only_realtime=True, pending_first=False, pull=True)
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
                self.budget_s = preemption_budget_s(fresh)
        cost = self.cost_model.current()
        return BatchWindow(
            max_jobs=self.service.batch_size,
            timeout_s=self.service.batch_timeout,
            max_tokens=self.service.max_total_tokens,
            max_run_s=self.budget_s,
            predict_s=lambda tokens: cost.predict_s(tokens, padding_ratio=self.padding),
        )

    def item(self, held: Held) -> BatchItem:
        if held.item is None:
            held.item = BatchItem(
                value=held,
                tokens=self.engine.count_tokens(engine_payload(held.job)),
                realtime=held.job.tier == Tier.REALTIME,
            )
        return held.item

    def form(
        self, *, only_realtime: bool = False, pending_first: bool = True, pull: bool = False
    ) -> list[Held]:
        """Claimed jobs waiting here first, then the tier queues, until the window closes.
        Past the drain limit only claimed jobs are formed, unless `pull` (realtime work)."""
        window = self.new_window()
        while pending_first and self.pending:
            held = self.pending[0]
            if not window.offer(self.item(held), arrived_at=held.job.created_at.timestamp()):
                break
            self.pending.popleft()
        if (self.pulling or (pull and self.reader is not None)) and not window.full:
            try:
                self.fill(window, only_realtime=only_realtime)
            except BROKER_ERRORS:
                # The broker went away mid-batch: run what the window holds; a fresh
                # connection opens for the next task. Pulled messages return to their queues
                # when the broken channel closes; their jobs' outcomes are stored anyway.
                logger.warning("broker connection lost while forming a batch", exc_info=True)
                self.runner._readers.discard(self.service.name)
                self.reader = None
        return [item.value for item in window.items]

    def fill(self, window: BatchWindow, *, only_realtime: bool) -> None:
        """Take what is waiting now, always; wait for more only while the window is open.

        The deadline bounds how long a batch waits for company, never what it takes: under a
        backlog every job is past its deadline, and the batch must still fill from the queue.
        """
        while not window.full:
            # A realtime batch takes only other realtime jobs: P0 never waits behind a big
            # batch of offline work in its own forward pass.
            realtime = only_realtime or window.has_realtime
            pm = self.reader.get([Tier.REALTIME] if realtime else None)
            if pm is not None:
                self.admit(pm, window)
                continue
            if not window.items or window.should_close():
                return
            time.sleep(min(POLL_INTERVAL_S, window.remaining_s()))

    def admit(self, pm: PulledMessage, window: BatchWindow) -> None:
        try:
            claim = Job.objects.claim(
                pm.job_ids,
                redelivered_ids=pm.job_ids if pm.redelivered else [],
                worker=self.worker,
            )
        except BaseException:
            # Not in the ledger yet, so the run's failure handler would not hand it back: it
            # would stay unacked on this reader's live channel until the lost-message sweep.
            self.runner._settle(self.service.name, [pm], ack=False)
            raise
        self.runner._note_claim(claim, self.report)
        if not claim.jobs:
            # Duplicates, cancelled, expired or finished jobs: nothing to run.
            self.runner._settle(self.service.name, [pm], ack=True)
            return
        self.ledger.track(pm, {str(job.pk) for job in claim.jobs})
        for job in claim.jobs:
            held = Held(job, claim)
            # What does not fit waits here, claimed, for the next batch of this loop.
            if window.full or not window.offer(
                self.item(held), arrived_at=job.created_at.timestamp()
            ):
                self.pending.append(held)

    # --- storing ----------------------------------------------------------------------------

    def store(self, batch: list[Held], outcomes: list[Outcome]) -> None:
        report = self.report
        report.tiers = sorted(set(report.tiers) | {h.job.tier for h in batch})
        if outcomes[0].inference_ms is not None and outcomes[0].batch_size == len(batch):
            self.cost_model.observe_batch(
                outcomes[0].inference_ms / 1000, sum(h.item.tokens for h in batch)
            )
        metrics.observe_batch(self.service, outcomes)
        for outcome in outcomes:
            if outcome.result and "first_token_ms" in outcome.result:
                metrics.observe_time_to_first_token(
                    self.service.name, outcome.result["first_token_ms"] / 1000
                )
        by_token: dict = {}
        for held, outcome in zip(batch, outcomes, strict=True):
            by_token.setdefault(held.claim.token, []).append(outcome)
        for token, token_outcomes in by_token.items():
            # Routed jobs: record local attempts, hand failures to the next fallback.
            settled = settle_local_outcomes(token, token_outcomes)
            Job.objects.store_outcomes(token, settled)
            dead = [o.job.pk for o in settled if o.result is None and o.dead_letter]
            if dead:
                dead_letter(dead, "the model raised on this job's input")
        report.ran += sum(o.result is not None for o in outcomes)
        report.failed += sum(o.result is None for o in outcomes)
        self.failed_ids |= {str(o.job.pk) for o in outcomes if o.result is None}
        # Outcomes are stored: only now may RabbitMQ forget the messages.
        finished = self.ledger.finished({str(h.job.pk) for h in batch})
        self.runner._settle(self.service.name, finished, ack=True)


def forward_pass(engine, jobs: list[Job], tokens: list[int]) -> list[Outcome]:
    """Run the jobs together (in the model thread); one outcome per job, in order."""
    started_at = timezone.now()
    started = time.perf_counter()
    payloads = [engine_payload(job) for job in jobs]
    relay = None
    if any(payload.get("stream") for payload in payloads):
        # Generated text goes out as it is produced (inference.streaming).
        relay = TextRelay({i: job.pk for i, job in enumerate(jobs)})
    try:
        if relay is not None:
            results = engine.run_batch(payloads, on_text=relay)
        else:
            results = engine.run_batch(payloads)
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
            for job, n in zip(jobs, tokens, strict=True)
            for outcome in forward_pass(engine, [job], [n])
        ]
    elapsed_ms = (time.perf_counter() - started) * 1000
    if relay is not None:
        for index, first_at in relay.first_text_at.items():
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
