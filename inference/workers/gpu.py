"""Turns one delivered job into a micro-batch, runs it, stores outcomes, acks messages.

Called by the thin `inference.run_job` task. The delivered (seed) job opens a BatchWindow; the
runner fills it from the service's tier queues (TierQueueReader) until it closes, claims the
jobs atomically in Postgres, runs one batched forward pass per length bucket (the engine), and
stores every outcome before acknowledging any pulled message.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from django.conf import settings
from django.utils import timezone

from inference import metrics
from inference.batching import BatchItem, BatchWindow
from inference.cost_model import BatchCostModel, preemption_budget_s
from inference.engines import load_engine
from inference.kinds import kind_of
from inference.log_fields import job_fields
from inference.models import Job
from inference.placement import fail_over_local_error, settle_local_outcomes
from inference.publishing import dead_letter
from inference.tiers import Tier
from inference.transitions import Claim, Outcome
from inference.workers import worker_identity
from inference.workers.tier_reader import BROKER_ERRORS, PulledMessage, ReaderPool

logger = logging.getLogger(__name__)


class InferenceTimeout(Exception):
    """The forward pass ran past the service's inference_timeout."""


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise InferenceTimeout in this thread after `seconds`. A SIGALRM timer, so only in the
    main thread (prefork and solo pools run tasks there); elsewhere there is no limit. torch
    returns to Python between operators, where the exception is raised."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(_signum, _frame):
        raise InferenceTimeout(f"exceeded {seconds:g} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# Between empty polls of the tier queues while a window is open. Small against batch_timeout
# (10 ms and up) yet cheap: each poll is one basic.get per tier on a local broker.
POLL_INTERVAL_S = 0.002


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
    seed_failed: bool = False
    tiers: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return self.__dict__.copy()


class BatchRunner:
    def __init__(self, readers: ReaderPool):
        self._readers = readers

    def run(self, seed_job_id: str, *, seed_redelivered: bool, seed_tier: str | None) -> dict:
        report = BatchReport()
        worker = worker_identity()
        seed_claim = Job.objects.claim(
            [seed_job_id],
            redelivered_ids=[seed_job_id] if seed_redelivered else [],
            worker=worker,
        )
        report.expired += len(seed_claim.expired)
        if seed_claim.dead_lettered:
            dead_letter(seed_claim.dead_lettered, "its workers were lost too many times")
        if not seed_claim.jobs:
            report.dropped += 1 - len(seed_claim.expired)
            return report.as_dict()

        seed = seed_claim.jobs[0]
        service = seed.service
        try:
            engine = load_engine(service.kind, service.model_ref, device=settings.RENQ_DEVICE)
        except Exception as exc:
            # The local backend is down: a routed job moves down its cascade (routing/).
            if not fail_over_local_error(seed_claim.token, seed, exc):
                raise
            report.failed += 1
            return report.as_dict()
        reader = self._readers.get(service.name)
        if reader is not None and seed_tier:
            reader.share.served(Tier(seed_tier))

        cost_model = BatchCostModel(service.name, engine.device)
        cost = cost_model.current()
        padding = getattr(engine, "max_padding_ratio", 0.0)
        window: BatchWindow[tuple[Job, Claim]] = BatchWindow(
            max_jobs=service.batch_size,
            timeout_s=service.batch_timeout,
            max_tokens=service.max_total_tokens,
            max_run_s=preemption_budget_s(service),
            predict_s=lambda tokens: cost.predict_s(tokens, padding_ratio=padding),
        )
        window.offer(
            self._item(engine, seed, seed_claim),
            arrived_at=seed.created_at.timestamp(),
        )
        pulled: list[PulledMessage] = []
        try:
            if reader is not None:
                self._fill_or_drop_reader(window, reader, engine, pulled, worker, report)
            outcomes = self._run_batch(engine, window.items, report, cost_model)
            # The seed is the window's first item.
            report.seed_failed = outcomes[0].result is None
        except BaseException:
            # Outcomes may not be stored: hand the pulled messages back now (redelivered, the
            # claim is taken over) rather than waiting for the stale-claim sweep.
            self._settle_messages(service.name, pulled, ack=False)
            raise
        # Outcomes are stored: only now may RabbitMQ forget the messages.
        self._settle_messages(service.name, pulled, ack=True)
        return report.as_dict()

    def _fill_or_drop_reader(self, window, reader, engine, pulled, worker, report) -> None:
        try:
            self._fill(window, reader, engine, pulled, worker, report)
        except BROKER_ERRORS:
            # The broker went away mid-batch: run what the window holds, open a fresh
            # connection for the next batch. Pulled messages return to their queues when the
            # broken channel closes; their jobs' outcomes are stored under the claim anyway.
            logger.warning("broker connection lost while forming a batch", exc_info=True)
            self._readers.discard(reader.service_name)

    def _settle_messages(self, service_name: str, pulled: list[PulledMessage], *, ack: bool):
        try:
            for pm in pulled:
                if not pm.message.acknowledged:
                    pm.message.ack() if ack else pm.message.requeue()
        except BROKER_ERRORS:
            # A dead channel gives its unacked messages back to RabbitMQ by itself; their
            # redelivery finds the jobs finished (or takes the claim over) in Postgres.
            logger.warning("could not settle %d pulled messages", len(pulled), exc_info=True)
            self._readers.discard(service_name)

    @staticmethod
    def _item(engine, job: Job, claim: Claim) -> BatchItem[tuple[Job, Claim]]:
        return BatchItem(
            value=(job, claim),
            tokens=engine.count_tokens(engine_payload(job)),
            realtime=job.tier == Tier.REALTIME,
        )

    def _fill(self, window, reader, engine, pulled, worker, report) -> None:
        """Take what is waiting now, always; wait for more only while the window is open.

        The deadline bounds how long a batch waits for company, never what it takes: under a
        backlog every seed is past its deadline, and the batch must still fill from the queue.
        """
        while not window.full:
            # A realtime batch takes only other realtime jobs: P0 never waits behind a big
            # batch of offline work in its own forward pass.
            tiers = [Tier.REALTIME] if window.has_realtime else None
            burst: list[PulledMessage] = []
            while len(window) + len(burst) < window.max_jobs:
                pm = reader.get(tiers)
                if pm is None:
                    break
                burst.append(pm)
            if burst:
                pulled.extend(burst)
                self._admit(burst, window, engine, worker, report)
                continue
            if window.should_close():
                return
            time.sleep(min(POLL_INTERVAL_S, window.remaining_s()))

    def _admit(self, burst, window, engine, worker, report) -> None:
        claim = Job.objects.claim(
            [pm.job_id for pm in burst],
            redelivered_ids=[pm.job_id for pm in burst if pm.redelivered],
            worker=worker,
        )
        report.expired += len(claim.expired)
        if claim.dead_lettered:
            dead_letter(claim.dead_lettered, "its workers were lost too many times")
        runnable = {str(job.pk): job for job in claim.jobs}
        to_release = []
        for pm in burst:
            job = runnable.pop(pm.job_id, None)
            if job is None:
                continue  # duplicate, cancelled, expired or finished: ack with the batch
            item = self._item(engine, job, claim)
            if not window.offer(item, arrived_at=job.created_at.timestamp()):
                to_release.append(pm)
        if to_release:
            # Did not fit the token budget: give the jobs back and requeue their messages so
            # the next batch (here or on another worker) takes them.
            Job.objects.filter(
                pk__in=[pm.job_id for pm in to_release], claim_token=claim.token
            ).release()
            for pm in to_release:
                pm.message.requeue()
            report.requeued += len(to_release)

    def _run_batch(
        self, engine, items: list[BatchItem], report: BatchReport, cost_model: BatchCostModel
    ) -> list[Outcome]:
        jobs = [item.value[0] for item in items]
        report.tiers = sorted({job.tier for job in jobs})
        outcomes = self._infer(engine, jobs, [item.tokens for item in items])
        if outcomes[0].inference_ms is not None and outcomes[0].batch_size == len(jobs):
            cost_model.observe_batch(
                outcomes[0].inference_ms / 1000, sum(item.tokens for item in items)
            )
        metrics.observe_batch(jobs[0].service, outcomes)
        by_token: dict = {}
        for item, outcome in zip(items, outcomes, strict=True):
            by_token.setdefault(item.value[1].token, []).append(outcome)
        for token, token_outcomes in by_token.items():
            # Routed jobs: record local attempts, hand failures to the next fallback.
            settled = settle_local_outcomes(token, token_outcomes)
            Job.objects.store_outcomes(token, settled)
            dead = [o.job.pk for o in settled if o.result is None and o.dead_letter]
            if dead:
                dead_letter(dead, "the model raised on this job's input")
        report.ran += sum(o.result is not None for o in outcomes)
        report.failed += sum(o.result is None for o in outcomes)
        return outcomes

    @staticmethod
    def _infer(engine, jobs: list[Job], tokens: list[int]) -> list[Outcome]:
        started_at = timezone.now()
        started = time.perf_counter()
        limit_s = jobs[0].service.inference_timeout
        try:
            with time_limit(limit_s):
                results = engine.run_batch([engine_payload(job) for job in jobs])
        except InferenceTimeout:
            # Not a verdict on any one input: the attempt is over, a routed job moves down its
            # cascade, and the cost model learns the batch was too long.
            logger.warning("batch of %d exceeded inference_timeout %g s", len(jobs), limit_s)
            return [
                Outcome(
                    job=job,
                    error=f"the forward pass exceeded the service's inference_timeout "
                    f"({limit_s:g} s)",
                    started_at=started_at,
                )
                for job in jobs
            ]
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
                for outcome in BatchRunner._infer(engine, [job], [n])
            ]
        elapsed_ms = (time.perf_counter() - started) * 1000
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
