"""The GPU worker's entry: one delivered message's jobs, and the loop they start."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from functools import partial

from django.conf import settings

from inference.dispatch import fair_share
from inference.dispatch.settlement import fail_over_local_error
from inference.engines import load_engine
from inference.intake.lookups import active_service_of_queue
from inference.jobs.tiers import Tier
from inference.models import Job
from inference.workers import worker_identity
from inference.workers.gpu.early_pass import EarlyPass, HeadStarts, start_early_pass
from inference.workers.gpu.generation_loop import GenerationLoop
from inference.workers.gpu.held import Held
from inference.workers.gpu.intake import note_claim
from inference.workers.gpu.loop import DrainLoop
from inference.workers.gpu.model_thread import ModelThread
from inference.workers.gpu.report import BatchReport
from inference.workers.gpu.store_thread import beside_stores
from inference.workers.leases import lease_keeper
from inference.workers.tier_reader import ReaderPool
from renq_site import tracing

logger = logging.getLogger(__name__)


class BatchRunner:
    """One per worker process: its readers of the tier queues and its model thread.
    `served`: the services whose queues the worker consumes (another's realtime work ends a
    run)."""

    def __init__(
        self, readers: ReaderPool | None, served: Callable[[], Iterable[str]] = tuple
    ):
        self._readers = readers
        self._served = served
        self._served_names: list[str] | None = None  # the -Q queues never change: read once
        self._model_thread = ModelThread()
        self.head_starts = HeadStarts(self._model_thread, serve=self.run_handed_over)

    def run(
        self,
        seed_job_ids: list[str],
        *,
        seed_redelivered: bool,
        seed_tier: str | None,
        seed_taken: dict[str, float] | None = None,
        seed_queue: str | None = None,
        seed_input: str | None = None,
    ) -> dict:
        """Claim the seed jobs (the task's message), then drain: run them and what waits
        behind them. `seed_taken`: the seed message's queue and start tag, which move that
        queue's fair-share clock (fair_share.advance). `seed_input`: the input a realtime
        seed's message carried (from `seed_queue`): its pass starts before its claim
        (early_pass). Returns the BatchReport, as a dict."""
        with lease_keeper.holding():
            # On the store thread, beside the claim: a Redis round trip that need not sit
            # between an idle realtime job's delivery and its pass (the clock only moves up).
            moved = beside_stores(partial(fair_share.advance, seed_taken)) if seed_taken else None
            head_start = self.head_starts.begin(
                seed_job_ids[0] if len(seed_job_ids) == 1 and seed_tier == Tier.REALTIME else None
            )
            try:
                return self._run(
                    seed_job_ids,
                    seed_redelivered=seed_redelivered,
                    seed_tier=seed_tier,
                    seed_queue=seed_queue,
                    seed_input=seed_input,
                    head_start=head_start,
                )
            finally:
                self.head_starts.end()
                if moved is not None:
                    moved.result()  # never raises: a clock that could not move is logged

    def run_handed_over(self, early: EarlyPass) -> dict:
        """Claim, run and store the job whose head start this process took and whose
        submitter handed it over (inference.dispatch.handover): a run of that job alone, on
        the caller's thread, with no message to ack and none pulled."""
        with lease_keeper.holding():
            return self._run(
                [early.job_id],
                seed_redelivered=False,
                seed_tier=Tier.REALTIME,
                seed_queue=None,
                seed_input=None,
                head_start=early,
                pulling=False,
            )

    def _served_services(self) -> list[str]:
        if self._served_names is None:
            self._served_names = list(self._served())
        return self._served_names

    def _run(
        self,
        seed_job_ids: list[str],
        *,
        seed_redelivered: bool,
        seed_tier: str | None,
        seed_queue: str | None,
        seed_input: str | None,
        head_start: EarlyPass | None,
        pulling: bool = True,
    ) -> dict:
        report = BatchReport()
        worker = worker_identity()
        seed_trace = tracing.current_context()  # the task's span, in its message's trace
        early = head_start
        if early is not None:
            early.trace_in(seed_trace)
        elif seed_input is not None and seed_queue and seed_tier == Tier.REALTIME:
            if len(seed_job_ids) == 1:
                early = start_early_pass(
                    self._model_thread, seed_job_ids[0], seed_queue, seed_input, seed_trace
                )
        with tracing.batch_span("renq.claim", [seed_trace], job_ids=seed_job_ids, tier=seed_tier):
            seed_claim = Job.objects.claim(
                seed_job_ids,
                redelivered_ids=seed_job_ids if seed_redelivered else [],
                worker=worker,
            )
        note_claim(seed_claim, report)
        service = seed_claim.jobs[0].service if seed_claim.jobs else None
        if service is None:
            report.dropped += len(seed_job_ids) - len(seed_claim.expired)
            # Nothing to run (expired, cancelled, a duplicate): the run drains on from the
            # seed's queue, where more such messages wait after an outage, claimed in bulk,
            # not one task each.
            service = active_service_of_queue(seed_queue)
            if service is None:
                return report.as_dict()
        try:
            engine = load_engine(service.kind, service.model_ref, device=settings.RENQ_DEVICE)
        except Exception as exc:
            # The local backend is down: a routed job moves down its cascade (routing/).
            for job in seed_claim.jobs:
                if not fail_over_local_error(seed_claim.token, job, exc):
                    raise
            report.failed += len(seed_claim.jobs)
            return report.as_dict()
        readers = self._readers if pulling else None
        reader = readers.get(service.name) if readers is not None else None
        if not seed_claim.jobs and (
            reader is None or getattr(engine, "supports_continuous", False)
        ):
            return report.as_dict()
        if getattr(engine, "supports_continuous", False):
            # An LLM with continuous batching: jobs join its decode loop as they arrive.
            loop = GenerationLoop(
                service, engine, reader, readers=readers, worker=worker, report=report
            )
        else:
            loop = DrainLoop(
                service,
                engine,
                reader,
                readers=readers,
                model_thread=self._model_thread,
                worker=worker,
                report=report,
                also_served=self._served_services(),
            )
        for job in seed_claim.jobs:
            loop.hold(
                Held(job, seed_claim, trace=seed_trace), Tier(seed_tier) if seed_tier else None
            )
        try:
            if isinstance(loop, DrainLoop):
                # A head start may begin while the last outcomes are stored; a run handed
                # over runs on the head starts' thread, which takes the next one meanwhile.
                if pulling:
                    loop.run(early=early, on_model_free=self.head_starts.end)
                else:
                    loop.run(early=early, store_behind=True)
            else:
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
        return report.as_dict()


def _release_stopped_claims(worker: str) -> None:
    """This pool process was stopped on request: Celery terminates it (SIGTERM, which billiard
    turns into SystemExit) when its broker connection drops with the task running, and at a
    cold shutdown. No job made it fail, so every job it holds goes back to queued with its
    attempt uncounted, or broker restarts would fail good jobs as poison."""
    try:
        released = Job.objects.filter(worker=worker).release()
    except Exception:  # noqa: BLE001 - their messages come back all the same: taken over then
        logger.warning("could not release the claims of %s", worker, exc_info=True)
        return
    if released:
        logger.warning("stopped on request: %d claimed jobs go back to their queues", released)
