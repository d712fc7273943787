"""Writing a pass's outcomes on the store thread while the loop forms and runs the next batch.

The store thread only writes (in Postgres, on its own connection), through the settlement of
each claim's attempts (inference.dispatch.settlement); the loop's thread acks, once the write
is done, and at most one write is in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

from django.db import connections

from inference.delivery.waiting import answer_before_store
from inference.dispatch.publishing import dead_letter
from inference.dispatch.settlement import (
    local_attempts,
    record_local_throughput,
    settle_attempts,
)
from inference.jobs.tiers import Tier
from inference.jobs.transitions import Claim, Outcome
from inference.metrics.events import observe_batch, observe_time_to_first_token
from inference.models import Service
from inference.scheduling.cost_model import BatchCostModel
from inference.workers.gpu.held import Held, left_unfinished
from inference.workers.gpu.ledger import MessageLedger
from inference.workers.gpu.report import BatchReport
from renq_site import tracing
from renq_site.db_sessions import close_old_connections_checked_once_a_second
from routing.router import route_entries

logger = logging.getLogger(__name__)

# One per process, so the worker holds one more Postgres session, not one per task. Storing
# on the loop's thread would put each store between two claims on the path to the next pass.
_outcome_writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="store")


@dataclass
class Storing:
    """A batch whose finished outcomes the store thread is writing."""

    service: Service  # as the batch ran under it
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
        stored += settle_attempts(
            claim.token,
            local_attempts(outcomes, claim.route_backend_ids),
            all_failed_trips_breaker=True,
        )
    return stored


def beside_stores(work: Callable[[], object]) -> Future:
    """Run `work` on the store thread, between two stores: Postgres work that must not hold
    up forming the next batch (a release of held-back work)."""
    return _outcome_writer.submit(work)


def close_outcome_writer_connection() -> None:
    """Close the store thread's Postgres session (before the database it is on is dropped)."""
    _outcome_writer.submit(connections.close_all).result()


class OutcomeWriter:
    """One run's writes: hands each pass's finished outcomes to the store thread, then, once
    they are stored, acks the messages whose every job is stored and counts the batch."""

    def __init__(
        self, engine, cost_model: BatchCostModel, *, ledger: MessageLedger, report: BatchReport
    ):
        self._engine = engine
        self._cost_model = cost_model
        self._ledger = ledger
        self._report = report
        self._storing: Storing | None = None

    def announce(
        self, batch: list[Held], outcomes: list[Outcome], service: Service
    ) -> list[tuple[Held, Outcome]]:
        """Answer the clients waiting on the pass's successes now: before the next batch is
        formed and before the previous one's store is awaited. Returns the finished jobs'
        outcomes, for `write` to store without announcing them again."""
        finished = self._finished(batch, outcomes)
        answer_before_store(self._interactive_answers(service, finished))
        return finished

    def write(
        self,
        batch: list[Held],
        outcomes: list[Outcome],
        service: Service,
        *,
        passed: list[Outcome] | None = None,
        announced: list[tuple[Held, Outcome]] | None = None,
    ) -> None:
        """Hand the pass's finished outcomes to the store thread. The cost model learns from
        the pass (`passed`: its outcomes as it ran them, when a job run in parts has its
        whole outcome in `outcomes`) now, once the write is under way (its update is a Redis
        round trip, which must not hold up the results): the next batches are sized on it.
        `announced`: what `announce` returned for this pass, its clients already answered."""
        passed = outcomes if passed is None else passed
        report = self._report
        report.tiers = sorted(set(report.tiers) | {h.job.tier for h in batch})
        self.written()
        finished = self._finished(batch, outcomes) if announced is None else announced
        by_claim: dict = {}
        for held, outcome in finished:
            if outcome.result and "first_token_ms" in outcome.result:
                observe_time_to_first_token(service.name, outcome.result["first_token_ms"] / 1000)
            by_claim.setdefault(held.claim.token, (held.claim, []))[1].append(outcome)
        if announced is None:
            # Before the store is even handed over: the waiting front door answers now.
            answer_before_store(self._interactive_answers(service, finished))
        write = None
        if finished:
            span = tracing.start_batch_span(
                "renq.store",
                [held.trace for held, _ in finished],
                service=service.name,
                batch_size=len(finished),
                job_ids=[str(h.job.pk) for h, _ in finished] if tracing.enabled() else None,
            )
            write = _outcome_writer.submit(
                tracing.within(span, write_outcomes), list(by_claim.values())
            )
        self._storing = Storing(service, outcomes, [outcome for _, outcome in finished], write)
        if passed[0].inference_ms is not None and passed[0].batch_size == len(batch):
            self._cost_model.observe_batch(
                passed[0].inference_ms / 1000, sum(o.tokens for o in passed)
            )

    def written(self) -> None:
        """Wait for the batch being stored (its error raises here), then ack the messages
        whose every job is now stored and count the batch."""
        storing, self._storing = self._storing, None
        if storing is None:
            return
        if storing.write is not None:
            stored = storing.write.result()
            dead = [o.job.pk for o in stored if o.result is None and o.dead_letter]
            if dead:
                dead_letter(dead, "the model raised on this job's input")
            report = self._report
            report.ran += sum(o.result is not None for o in storing.finished)
            report.failed += sum(o.result is None for o in storing.finished)
            # Outcomes are stored: only now may RabbitMQ forget the messages.
            self._ledger.ack(self._ledger.finished({str(o.job.pk) for o in storing.finished}))
        # Statistics after the outcomes: a job is finished before its batch is counted.
        observe_batch(storing.service, storing.outcomes)
        record_local_throughput(storing.outcomes)

    def written_or_logged(self) -> None:
        """`written`, on the store thread after the write it waits for: an error is logged
        (a claim whose store failed lapses and is taken over)."""
        try:
            self.written()
        except Exception:  # noqa: BLE001 - nobody is waiting to raise it to
            logger.warning("could not store a batch's outcomes", exc_info=True)

    @staticmethod
    def _interactive_answers(service: Service, finished: list[tuple[Held, Outcome]]) -> list:
        """The successes of the tiers a client may be waiting on (realtime and api), each named
        by the backend its store will record (from the cached route; one whose backend is not
        there waits for its store's notice)."""
        answers = []
        names: dict[int, str] | None = None
        for held, outcome in finished:
            if outcome.result is None or not Tier(held.job.tier).is_interactive:
                continue
            backend_id = held.claim.route_backend_ids.get(held.job.pk)
            if backend_id is not None:
                if names is None:
                    names = {e.backend_id: e.backend.name for e in route_entries(service.pk)}
                if backend_id not in names:
                    continue
                outcome = replace(outcome, backend=names[backend_id])
            answers.append(outcome)
        return answers

    def _finished(
        self, batch: list[Held], outcomes: list[Outcome]
    ) -> list[tuple[Held, Outcome]]:
        """Generations left unfinished went back to the line; the rest are stored, with what
        their earlier passes took."""
        return [
            (held, self._whole(held, outcome))
            for held, outcome in zip(batch, outcomes, strict=True)
            if not left_unfinished(outcome)
        ]

    def _whole(self, held: Held, outcome: Outcome) -> Outcome:
        """The outcome of a generation over all of its passes (its last one's otherwise)."""
        if held.resume is None:
            return outcome
        return replace(
            outcome,
            started_at=held.resume.started_at or outcome.started_at,
            inference_ms=None
            if outcome.inference_ms is None
            else held.resume.inference_ms + outcome.inference_ms,
            # As if run at once: prompt + its whole budget, the tokens an attempt records.
            tokens=self._engine.count_tokens(held.resumed_payload()),
        )
