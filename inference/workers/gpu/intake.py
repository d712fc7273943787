"""Pulling dispatch messages from the service's tier queues and claiming their jobs.

Messages are pulled (basic.get) in tier order: realtime first, then only the queues of the
tiers whose turn comes before the claimed jobs waiting in the line. The jobs of the messages
pulled for one batch are claimed together in Postgres; each message is then tracked in the
ledger until its jobs' outcomes are stored.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from django.db import DatabaseError, InterfaceError
from django.utils import timezone

from inference.dispatch import fair_share
from inference.dispatch.fair_share import Clock
from inference.dispatch.publishing import dead_letter, holds_back, publish_many, release_held
from inference.dispatch.queues import tier_queue
from inference.intake.overdue import note_late_claims
from inference.jobs.tiers import Tier
from inference.jobs.transitions import Claim
from inference.models import Job, Service
from inference.scheduling.batch_window import BatchWindow
from inference.workers.gpu.held import Held
from inference.workers.gpu.ledger import MessageLedger
from inference.workers.gpu.line import Line
from inference.workers.gpu.report import BatchReport
from inference.workers.gpu.store_thread import beside_stores
from inference.workers.tier_reader import (
    BROKER_ERRORS,
    DEFAULT_WEIGHTS,
    PulledMessage,
    ReaderPool,
    TierQueueReader,
    WeightedShare,
)
from renq_site import tracing
from renq_site.db_sessions import close_old_connections_checked_once_a_second

logger = logging.getLogger(__name__)

# How often a worker process looks in Postgres for held-back work of a short queue that
# Redis noted none for (see Intake._advance_fair_share); queue → when next (monotonic).
HELD_LOOK_S = 1.0
_next_held_look: dict[str, float] = {}
# How often a run looks at the realtime queues of the worker's other services (a passive
# declare each): what waits there waits this long at most, plus the passes the run holds.
OTHER_REALTIME_LOOK_S = 0.1


# Queues whose release waits on the store thread: one at a time each.
_releasing: set[str] = set()


def _release_soon(
    service_name: str, tier: Tier, clock: Clock | None, *, look: bool, again: bool = False
) -> None:
    """Release held work on the store thread (a few Postgres round trips and publishes):
    not on the loop's, where it would lengthen forming and so form the next batch earlier.
    `look`: Redis noted none, so first ask Postgres whether any is held. `again`: even while
    a release of the queue is waiting; that one may have looked before a hold committed, and
    this one is the run's last (the worker goes idle)."""
    queue = tier_queue(service_name, tier)
    if queue in _releasing and not again:
        return
    _releasing.add(queue)

    def release() -> None:
        try:
            close_old_connections_checked_once_a_second()
            if not look or holds_back(service_name, tier):
                release_held(service_name, tier, clock)
        except Exception:  # noqa: BLE001 - held work stays held: a later pull or the sweep
            logger.warning("could not release held work of %s", queue, exc_info=True)
        finally:
            _releasing.discard(queue)

    beside_stores(release)


def note_claim(claim: Claim, report: BatchReport) -> None:
    """Count the jobs found past their deadline; mark the lines claimed late
    (inference.intake.overdue); dead-letter those whose workers were lost too many times."""
    report.expired += len(claim.expired)
    note_late_claims([*claim.jobs, *claim.expired], timezone.now())
    if claim.dead_lettered:
        dead_letter(claim.dead_lettered, "its workers were lost too many times")


@dataclass
class WindowPolls:
    """What one window's polls of the tier queues found. While a window waits for company,
    each poll asks realtime (a realtime job closes the window at once) and the tiers that gave
    it jobs; a tier below realtime found empty that gave it none is not asked again until the
    next window: each ask is a broker round trip, and under single-job load empty asks, most
    of them of tiers with no work at all, outnumbered messages."""

    supplied: set[Tier] = field(default_factory=set)
    quiet: set[Tier] = field(default_factory=set)
    # The tiers the last pull asked and found empty.
    last_empty: list[Tier] = field(default_factory=list)

    def before_waiting(self) -> None:
        """The window waits for company: what the last pull found empty goes quiet."""
        self.quiet.update(
            t for t in self.last_empty if t != Tier.REALTIME and t not in self.supplied
        )


class Intake:
    """One run's pulls from the service's tier queues, and the claims of what they bring."""

    def __init__(
        self,
        reader: TierQueueReader | None,
        *,
        readers: ReaderPool | None,
        service_name: str,
        batch_size: int,
        worker: str,
        pull_until: float,
        line: Line,
        ledger: MessageLedger,
        report: BatchReport,
        also_served: Sequence[str] = (),
    ):
        self.reader = reader  # None once the broker is lost: nothing more is pulled
        self._pull_until = pull_until  # time.monotonic()'s; after it only realtime work
        # The other services this worker serves, and when their realtime queues were looked at.
        self._also_served = also_served
        self._looked_elsewhere_at = -OTHER_REALTIME_LOOK_S
        self._readers = readers
        self._service_name = service_name
        self._batch_size = batch_size
        self._worker = worker
        self._line = line
        self._ledger = ledger
        self._report = report

    @classmethod
    def for_run(
        cls,
        service: Service,
        reader: TierQueueReader | None,
        *,
        readers: ReaderPool | None,
        worker: str,
        report: BatchReport,
        drain_limit_s: float,
        also_served: Sequence[str] = (),
    ) -> Intake:
        """One run's intake, with the run's ledger of pulled messages and its line of claimed
        jobs (ordered by the reader's tier share). `also_served`: the worker's other services,
        whose realtime work ends the run."""
        return cls(
            reader,
            readers=readers,
            service_name=service.name,
            batch_size=service.batch_size,
            worker=worker,
            pull_until=time.monotonic() + drain_limit_s,
            line=Line(reader.share if reader is not None else WeightedShare(DEFAULT_WEIGHTS)),
            ledger=MessageLedger(readers, service.name),
            report=report,
            also_served=[name for name in also_served if name != service.name],
        )

    @property
    def line(self) -> Line:
        return self._line

    @property
    def ledger(self) -> MessageLedger:
        return self._ledger

    @property
    def pulling(self) -> bool:
        """Messages may still be pulled: the broker is there, the drain limit not past, and no
        other service of this worker has realtime work waiting (it gets the next run)."""
        if self.reader is None or time.monotonic() >= self._pull_until:
            return False
        if self._realtime_elsewhere():
            self._pull_until = 0.0  # the run ends with the work it holds
            return False
        return True

    def _realtime_elsewhere(self) -> bool:
        """Whether another service of this worker has realtime work waiting: a run drains its
        own service for up to the drain limit, and the task's message holds the worker's one
        delivery slot meanwhile, so that work would wait for the run to end."""
        now = time.monotonic()
        if not self._also_served or now - self._looked_elsewhere_at < OTHER_REALTIME_LOOK_S:
            return False
        self._looked_elsewhere_at = now
        for name in self._also_served:
            reader = self._readers.get(name) if self._readers is not None else None
            if reader is None:
                continue
            try:
                if reader.waiting(Tier.REALTIME):
                    return True
            except BROKER_ERRORS:
                self._readers.discard(name)
        return False

    def reader_lost(self) -> None:
        """The broker connection broke: a fresh one opens for the next task."""
        self._readers.discard(self._service_name)
        self.reader = None

    def pull(
        self,
        window: BatchWindow | None,
        *,
        realtime: bool,
        polls: WindowPolls | None = None,
        room: int | None = None,
    ) -> list[PulledMessage]:
        """As many waiting messages as the window is likely to take (or, without a window,
        up to `room` jobs), to claim together: one claim per batch instead of one per
        message (each is a Postgres round trip between forward passes). Realtime first;
        below it, only the queues of tiers whose turn comes before claimed jobs waiting here.
        Stops at a realtime message, which changes what the window takes."""
        pulled: list[PulledMessage] = []
        room = max(1, window.likely_room() if window is not None else room or 1)
        jobs = 0
        # Queues found empty in this pull are not asked again until the next one (each ask is
        # a round trip). Realtime work arriving meanwhile is found before the batch starts
        # (DrainLoop.realtime_first).
        empty: set[Tier] = set(polls.quiet) if polls is not None else set()
        try:
            while jobs < room:
                tiers = [Tier.REALTIME] if realtime else self._line.tiers_ahead_of_waiting()
                tiers = [tier for tier in tiers if tier not in empty]
                pm = self.reader.get(tiers) if tiers else None
                if pm is None:
                    if polls is not None:
                        polls.last_empty = tiers
                    empty.update(tiers)
                    break
                pulled.append(pm)
                jobs += len(pm.job_ids)
                if pm.tier == Tier.REALTIME and not realtime:
                    break
                empty.update(tiers[: tiers.index(pm.tier)])
                if pm.left_in_queue == 0:
                    empty.add(pm.tier)
        except BaseException:
            # Pulled, not yet in the ledger: hand them back now, or they would stay unacked
            # on this reader's live channel until the lost-message sweep.
            self._ledger.requeue(pulled)
            raise
        self._advance_fair_share(pulled, short=empty)
        return pulled

    def pull_fresh(self, tiers: list[Tier]) -> list[PulledMessage]:
        """The message at the head of each of these tier queues if it went out fresh: its
        tenant had no work ahead of the queue's virtual time (fair_share), so it went at the
        top level. Any other head goes back to its place; looking charges no tier's share."""
        fresh: list[PulledMessage] = []
        back: list[PulledMessage] = []
        try:
            for tier in tiers:
                pm = self.reader.get([tier], charge=False)
                if pm is not None:
                    (fresh if pm.fresh else back).append(pm)
        except BaseException:
            self._ledger.requeue(fresh + back)
            raise
        self._ledger.requeue(back)
        for pm in fresh:
            self.reader.charge(pm)
        if fresh:
            self._advance_fair_share(fresh, short=set())
        return fresh

    def _advance_fair_share(
        self, pulled: list[PulledMessage], *, short: set[Tier], ending: bool = False
    ) -> None:
        """The tier queues' fair-share clocks move up to the start tags just taken; then work
        held back from them is released where its turn nears, or where a queue runs short
        (`short`: the tiers found empty) with held work noted in Redis. A short queue with
        none noted is looked for in Postgres at most every HELD_LOOK_S per process: the note
        can miss a hold that committed after a release."""
        taken: dict[str, float | None] = {}
        tiers: dict[str, Tier] = {}
        short = {tier for tier in short if tier != Tier.REALTIME}
        for pm in pulled:
            queue = tier_queue(self._service_name, pm.tier)
            tiers[queue] = pm.tier
            if pm.start_tag is not None:
                taken[queue] = max(pm.start_tag, taken.get(queue) or 0.0)
            # Fewer than two batches' jobs left, counting messages like this one.
            left = (pm.left_in_queue or 0) * len(pm.job_ids)
            if pm.tier != Tier.REALTIME and left < 2 * self._batch_size:
                short.add(pm.tier)
        now = time.monotonic()
        looks: set[str] = set()
        for tier in short:
            queue = tier_queue(self._service_name, tier)
            tiers[queue] = tier
            look = now >= _next_held_look.get(queue, 0.0)
            if look:
                _next_held_look[queue] = now + HELD_LOOK_S
                looks.add(queue)
            if look or ending:
                taken.setdefault(queue, None)  # its clock says whether work is held
        if not taken:
            return
        clocks = fair_share.advance(taken, going_idle=ending)
        for queue, tier in tiers.items():
            clock = clocks.get(queue)
            noted = clock is not None and clock.earliest_held is not None
            if (
                (clock is not None and clock.release_due)
                or (tier in short and noted)
                or (queue in looks and not noted)
            ):
                _release_soon(self._service_name, tier, clock, look=not noted, again=ending)

    def release_before_idle(self) -> None:
        """The run ends: work held back from the tier queues below realtime is released
        where Redis notes some (or, at most every HELD_LOOK_S, where Postgres holds some), so
        that a message starts the next run."""
        if self.reader is None:
            return  # nothing could be published either; the sweeper releases it later
        self._advance_fair_share([], short=set(WeightedShare.TIERS), ending=True)

    def hand_back(self, held: list[Held]) -> int:
        """Claimed jobs no pass of this worker has started go back to their queues, each
        still holding its place in its tenant's fair share: an idle peer takes them at once,
        and this worker again if none does. A message whose jobs are all settled or handed
        back is acked. Returns the jobs handed back."""
        if not held:
            return 0
        ids = [h.job.pk for h in held]
        released: list = []
        try:
            # Read before releasing: a released job must reach a queue without Postgres.
            jobs = Job.objects.filter(pk__in=ids).select_related(
                "service", "tenant", "route__backend"
            )
            by_id = {job.pk: job for job in jobs}
            for token in {h.claim.token for h in held}:
                mine = [h.job.pk for h in held if h.claim.token == token]
                if Job.objects.filter(pk__in=mine, claim_token=token).release():
                    released.extend(mine)
        except (DatabaseError, InterfaceError):
            # Postgres is away: what is still claimed stays here and runs in a later pass.
            logger.warning("could not hand back %d claimed jobs", len(held), exc_info=True)
        if released:
            back = sorted((by_id[pk] for pk in released), key=lambda job: job.created_at)
            self._publish_released(back)
        kept = set(ids) - set(released)
        self._line.put_first([h for h in held if h.job.pk in kept])
        self._ledger.ack(self._ledger.finished({str(pk) for pk in released}))
        self._report.handed_back += len(released)
        return len(released)

    @staticmethod
    def _publish_released(jobs: list[Job]) -> None:
        """Publish released jobs again; one the broker did not take goes to the outbox."""
        started = timezone.now()
        try:
            if publish_many(jobs, charged=True) < len(jobs):
                Job.objects.filter(
                    pk__in=[job.pk for job in jobs], published_at__lt=started
                ).unmark_published()
        except (DatabaseError, InterfaceError):
            # Sent, or left for the lost-message sweep: queued in Postgres either way.
            logger.warning("could not stamp %d handed-back jobs", len(jobs), exc_info=True)

    def claim(self, pulled: list[PulledMessage]) -> list[tuple[Held, Tier]]:
        """Claim the pulled messages' jobs in one go: the jobs to run, each with the tier of
        the message that brought it. A message with no job left to run is acked now."""
        traces = [tracing.message_context(pm.message.headers) for pm in pulled]
        job_ids = [job_id for pm in pulled for job_id in pm.job_ids]
        try:
            with tracing.batch_span(
                "renq.claim", traces, service=self._service_name, job_ids=job_ids
            ):
                claim = Job.objects.claim(
                    job_ids,
                    redelivered_ids=[i for pm in pulled if pm.redelivered for i in pm.job_ids],
                    worker=self._worker,
                )
        except BaseException:
            # Not in the ledger yet, so the run's failure handler would not hand them back:
            # they would stay unacked on this reader's live channel until the lost-message sweep.
            self._ledger.requeue(pulled)
            raise
        note_claim(claim, self._report)
        claimed_ids = {str(job.pk) for job in claim.jobs}
        tier_of: dict[str, Tier] = {}
        trace_of: dict = {}
        for pm, trace in zip(pulled, traces, strict=True):
            mine = claimed_ids.intersection(pm.job_ids)
            if self.reader is not None:
                self.reader.claimed(pm, len(mine))
            if mine:
                self._ledger.track(pm, mine)
                tier_of.update(dict.fromkeys(mine, pm.tier))
                trace_of.update(dict.fromkeys(mine, trace))
            else:
                # Duplicates, cancelled, expired or finished jobs: nothing to run.
                self._ledger.ack([pm])
        return [
            (Held(job, claim, trace=trace_of[str(job.pk)]), tier_of[str(job.pk)])
            for job in claim.jobs
        ]
