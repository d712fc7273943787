"""The GPU worker's entry: one delivered message's jobs, and the loop they start."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial

from billiard.process import current_process
from django.conf import settings

from inference.dispatch import fair_share
from inference.dispatch.queues import tier_queue
from inference.dispatch.settlement import fail_over_local_error
from inference.engines import load_engine
from inference.jobs.tiers import TIER_ORDER, Tier
from inference.models import Job, Service
from inference.workers import worker_identity
from inference.workers.gpu.generation_loop import GenerationLoop
from inference.workers.gpu.held import Held
from inference.workers.gpu.intake import note_claim
from inference.workers.gpu.loop import DrainLoop
from inference.workers.gpu.model_thread import ModelThread
from inference.workers.gpu.report import BatchReport
from inference.workers.gpu.store_thread import beside_stores
from inference.workers.leases import lease_keeper
from inference.workers.tier_reader import (
    BROKER_ERRORS,
    PulledMessage,
    ReaderPool,
    TierQueueReader,
)
from renq_site import tracing
from renq_site.celery import app
from renq_site.db_sessions import close_old_connections_checked_once_a_second

logger = logging.getLogger(__name__)


# A run that found nothing more to pull lingers (settings.RENQ_WORKER_LINGER_S) for the next
# message, pushed to its own channel: it skips Celery's parent process, the pipe to this pool
# process and a task's start, which at idle were much of a realtime job's overhead. It lingers
# no longer than this after its task started: the task's message stays unacked meanwhile, and
# a warm shutdown waits for the task.
LINGER_LIMIT_S = 10.0


def no_lingering(service_name: str) -> list[Tier]:
    return []


def consumed_tiers(service_name: str) -> list[Tier]:
    """The service's tiers whose queues this worker consumes (-Q), in a prefork pool process
    of a worker that consumes nothing else; elsewhere none. A lingering task keeps its
    worker's one prefetched message unacked, so a worker of other queues too would leave their
    messages waiting; a solo or thread pool lingers in Celery's own process, which would stop
    serving control commands meanwhile."""
    if current_process().name == "MainProcess":
        return []
    consumed = set(app.amqp.queues.consume_from or {})
    mine = {tier_queue(service_name, tier): Tier(tier) for tier in TIER_ORDER}
    if not consumed or not consumed <= mine.keys():
        return []
    return [tier for queue, tier in mine.items() if queue in consumed]


class BatchRunner:
    """One per worker process: its readers of the tier queues and its model thread.

    `lingers_on(service)`: the tier queues a run of the service waits on once it found nothing
    more to pull (none: the task returns at once)."""

    def __init__(
        self,
        readers: ReaderPool | None,
        *,
        lingers_on: Callable[[str], list[Tier]] = no_lingering,
    ):
        self._readers = readers
        self._model_thread = ModelThread()
        self._lingers_on = lingers_on

    def run(
        self,
        seed_job_ids: list[str],
        *,
        seed_redelivered: bool,
        seed_tier: str | None,
        seed_taken: dict[str, float] | None = None,
    ) -> dict:
        """Claim the seed jobs (the task's message), then drain: run them and what waits
        behind them; then linger for the next message. `seed_taken`: the seed message's queue
        and start tag, which move that queue's fair-share clock (fair_share.advance). Returns
        the BatchReport, as a dict."""
        started = time.monotonic()
        report = BatchReport()
        with lease_keeper.holding():
            # On the store thread, beside the claim: a Redis round trip that need not sit
            # between an idle realtime job's delivery and its pass (the clock only moves up).
            moved = beside_stores(partial(fair_share.advance, seed_taken)) if seed_taken else None
            try:
                service = self._run(
                    seed_job_ids,
                    seed_redelivered=seed_redelivered,
                    seed_tier=seed_tier,
                    report=report,
                )
            finally:
                if moved is not None:
                    moved.result()  # never raises: a clock that could not move is logged
            if service is not None:
                self._linger(service, report, until=started + LINGER_LIMIT_S)
        return report.as_dict()

    def _run(
        self,
        seed_job_ids: list[str],
        *,
        seed_redelivered: bool,
        seed_tier: str | None,
        report: BatchReport,
    ) -> Service | None:
        """Run the seed and what waits behind it; the service it ran, or None if nothing."""
        worker = worker_identity()
        seed_trace = tracing.current_context()  # the task's span, in its message's trace
        with tracing.batch_span("renq.claim", [seed_trace], job_ids=seed_job_ids, tier=seed_tier):
            seed_claim = Job.objects.claim(
                seed_job_ids,
                redelivered_ids=seed_job_ids if seed_redelivered else [],
                worker=worker,
            )
        note_claim(seed_claim, report)
        if not seed_claim.jobs:
            report.dropped += len(seed_job_ids) - len(seed_claim.expired)
            return None

        service = seed_claim.jobs[0].service
        try:
            engine = load_engine(service.kind, service.model_ref, device=settings.RENQ_DEVICE)
        except Exception as exc:
            # The local backend is down: a routed job moves down its cascade (routing/).
            for job in seed_claim.jobs:
                if not fail_over_local_error(seed_claim.token, job, exc):
                    raise
            report.failed += len(seed_claim.jobs)
            return None
        reader = self._readers.get(service.name) if self._readers is not None else None
        loop = self._loop(service, engine, reader, worker, report)
        for job in seed_claim.jobs:
            loop.hold(
                Held(job, seed_claim, trace=seed_trace), Tier(seed_tier) if seed_tier else None
            )
        self._drive(loop, worker)
        return service

    def _linger(self, service: Service, report: BatchReport, *, until: float) -> None:
        """Wait for the service's next message on this process's channel and run it, until
        none comes within RENQ_WORKER_LINGER_S or the time is up."""
        tiers = self._lingers_on(service.name)
        if settings.RENQ_WORKER_LINGER_S <= 0 or self._readers is None:
            return
        worker = worker_identity()
        try:
            engine = load_engine(service.kind, service.model_ref, device=settings.RENQ_DEVICE)
        except Exception:  # noqa: BLE001 - the next task fails its jobs over
            logger.warning("cannot load %s to linger", service.name, exc_info=True)
            return
        while tiers and (left := until - time.monotonic()) > 0:
            reader = self._readers.get(service.name)
            if reader is None:
                return
            # Made before the message comes, so that its making is not on the message's path.
            loop = self._loop(service, engine, reader, worker, report)
            try:
                pulled = reader.wait_for_push(tiers, min(settings.RENQ_WORKER_LINGER_S, left))
            except BROKER_ERRORS:
                logger.warning("broker connection lost while lingering", exc_info=True)
                self._readers.discard(service.name)
                return
            if pulled is None:
                return
            self._run_pulled(loop, pulled, worker)

    def _run_pulled(
        self, loop: DrainLoop | GenerationLoop, pulled: PulledMessage, worker: str
    ) -> None:
        """Run a message that came while lingering, and what waits behind it, as a task runs
        its seed; it is acked from this channel once its jobs are stored."""
        taken = {tier_queue(loop.intake.service_name, pulled.tier): pulled.start_tag}
        moved = (
            beside_stores(partial(fair_share.advance, taken))
            if pulled.start_tag is not None
            else None
        )
        try:
            # A request boundary, as at a task's start (inference.tasks).
            close_old_connections_checked_once_a_second()
            held = loop.intake.claim([pulled])  # acked at once if none of its jobs can run
            for each, tier in held:
                loop.hold(each, tier)
            if held:
                self._drive(loop, worker)
        finally:
            if moved is not None:
                moved.result()

    def _loop(
        self,
        service: Service,
        engine,
        reader: TierQueueReader | None,
        worker: str,
        report: BatchReport,
    ) -> DrainLoop | GenerationLoop:
        if getattr(engine, "supports_continuous", False):
            # An LLM with continuous batching: jobs join its decode loop as they arrive.
            return GenerationLoop(
                service, engine, reader, readers=self._readers, worker=worker, report=report
            )
        return DrainLoop(
            service,
            engine,
            reader,
            readers=self._readers,
            model_thread=self._model_thread,
            worker=worker,
            report=report,
        )

    @staticmethod
    def _drive(loop: DrainLoop | GenerationLoop, worker: str) -> None:
        try:
            loop.run()
        except BaseException as exc:
            if isinstance(exc, SystemExit):
                _release_stopped_claims(worker)
            # Outcomes may not be stored: hand the pulled messages back now (redelivered, the
            # claim is taken over) rather than waiting for a lease to lapse.
            loop.ledger.requeue(loop.ledger.unsettled())
            raise
        # Every job ran or was handed back, so none should be left; should one be (a hand-back
        # Postgres refused halfway), its message goes back rather than stay unacked here.
        loop.ledger.requeue(loop.ledger.unsettled())
        # Nothing left to pull: work held back for its fair-share turn goes out now, or no
        # message would start the next task.
        loop.intake.release_before_idle()


def _release_stopped_claims(worker: str) -> None:
    """This pool process was stopped on request: Celery terminates it (SIGTERM, which billiard
    turns into SystemExit) when its broker connection drops with the task running, and at a
    cold shutdown. No job made it fail, so every job it holds goes back to queued with its
    attempt uncounted; taken over from their redelivered messages instead, each stop counted
    an attempt, and a RabbitMQ restart or two failed good jobs as poison."""
    try:
        released = Job.objects.filter(worker=worker).release()
    except Exception:  # noqa: BLE001 - their messages come back all the same: taken over then
        logger.warning("could not release the claims of %s", worker, exc_info=True)
        return
    if released:
        logger.warning("stopped on request: %d claimed jobs go back to their queues", released)
