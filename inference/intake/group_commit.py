"""Group commit for the submit path: submissions that reach one process at the same time share
one round trip to PostgreSQL (one transaction, one WAL flush) and one publish.

Alone, each single-job POST would pay a commit (a WAL flush), a publish and its confirm of its
own, in Postgres, RabbitMQ and the web alike, and its job would travel in a message of its own.
Here the first submission to arrive while none is committing leads: it commits its own
statements, and whatever arrived while it did is committed next, together, by the next
leader. Nothing waits for a group to fill (an idle process commits each submission at once);
a group is what piled up during one round trip, so it grows with the load.

A group is one implicit transaction: it commits whole or not at all. When it fails (a queue
full, a quota reached, an Idempotency-Key taken, Postgres away), every member runs its own
statements alone, so each gets exactly the answer it would have got without the group; when
its connection broke with the statements sent (it may have committed), every member is told
so (OutcomeUnknown) instead.
Members go in order of the advisory locks they take (their admission checks: a service's
queue capacity, a tenant's running jobs), and a member's own statements stay in their order,
so its checks count the jobs of the members before it. Every transaction takes its locks in
ascending key order, as a lone submission's checks do, so no two wait on each other in a
circle: when the members' locks, one member after another, would not be taken in that order
(a member locking two services, or a service and its tenant), the group takes them all first.

The jobs of a committed group are published together (jobs bound for one tier queue share a
message), and every member returns after that publish, as it would have alone.

A submission whose caller waits for its job's outcome need not wait for the WAL flush
(`durable=False`): it commits as a claim does (ASYNC_COMMIT), and its caller makes it durable
before telling a client the job was accepted without an outcome (row_writer.wait_until_flushed).
A group commits that way only when none of its members needs the flush.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Sequence

from inference.intake.row_writer import OutcomeUnknown
from inference.jobs.transitions import ASYNC_COMMIT
from inference.models import Job

logger = logging.getLogger(__name__)

# Most submissions one group commits (its query string grows with them).
MAX_GROUP_SUBMISSIONS = 32
# A submission of more jobs commits alone: it already pays its round trips once for many jobs,
# and in a group it would wait for the others' messages to be published and confirmed one
# after another, losing more than the group saves it.
MAX_GROUPED_JOBS = 8

Statements = Sequence[tuple[str, list]]
# First in a transaction that need not wait for the WAL flush.
_SKIP_FLUSH = (ASYNC_COMMIT.rstrip(";\n"), [])


class _Submission:
    __slots__ = ("statements", "jobs", "lock_order", "durable", "done", "outcome")

    def __init__(
        self,
        statements: Statements,
        jobs: Sequence[Job],
        lock_order: tuple,
        durable: bool = True,
    ):
        self.statements, self.jobs, self.lock_order = statements, jobs, lock_order
        self.durable = durable
        self.done = threading.Event()
        # "committed", "alone" (run your own statements), "lead", or "unknown" (the group's
        # connection broke with its statements sent: they may have committed)
        self.outcome = ""


class GroupCommit:
    """Commits and publishes submissions of one process, grouping those that arrive together.

    `execute(statements)` runs statements in one round trip as one transaction (raising a
    DatabaseError rolls them all back); `publish(jobs)` publishes committed jobs and does not
    raise (a failed publish is the outbox's)."""

    def __init__(
        self,
        execute: Callable[[Statements], None],
        publish: Callable[[Sequence[Job]], object],
        max_group: int = MAX_GROUP_SUBMISSIONS,
    ):
        self._execute, self._publish, self._max_group = execute, publish, max_group
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._waiting: list[_Submission] = []
        self._leading = False
        self.groups_committed = 0  # groups of two or more (the tests read it)

    def submit(
        self,
        statements: Statements,
        jobs: Sequence[Job],
        lock_order: tuple = (),
        durable: bool = True,
    ) -> None:
        """Commit one submission's statements and publish its jobs; returns once both are done.
        Raises the DatabaseError its statements raise when run alone (and then nothing of it
        was committed or published). `lock_order`: the keys, (space, id), of the advisory locks
        its statements take, in ascending order. `durable=False`: its commit need not wait
        for the WAL flush."""
        if self._pid != os.getpid():
            self._reset()  # a forked child: its parent's threads are not here
        mine = _Submission(statements, jobs, lock_order, durable)
        if len(jobs) > MAX_GROUPED_JOBS:
            self._alone(mine)
            return
        with self._lock:
            self._waiting.append(mine)
            lead = not self._leading
            self._leading = True
        if not lead:
            mine.done.wait()
            if mine.outcome == "committed":
                return
            if mine.outcome == "alone":
                self._alone(mine)
                return
            if mine.outcome == "unknown":
                raise OutcomeUnknown("the connection broke under this submission's group")
            # "lead": the previous leader handed this thread the submissions waiting now.
        self._lead(mine)

    def _lead(self, mine: _Submission) -> None:
        with self._lock:
            group = self._waiting[: self._max_group]
            del self._waiting[: self._max_group]
        committed = False
        try:
            committed = self._commit(group, mine)
        finally:
            # The next group commits while this one publishes.
            with self._lock:
                if self._waiting:
                    successor = self._waiting[0]
                    successor.outcome = "lead"
                    successor.done.set()
                else:
                    self._leading = False
        if not committed:
            self._alone(mine)
            return
        try:
            self._publish([job for s in group for job in s.jobs])
        finally:
            for member in group:
                if member is not mine:
                    member.outcome = "committed"
                    member.done.set()

    def _commit(self, group: list[_Submission], mine: _Submission) -> bool:
        """Commit the group; False if nothing of it was (each member then runs alone)."""
        if len(group) == 1:
            self._execute(_committed_as(mine.statements, [mine]))  # raises to its caller
            return True
        group.sort(key=lambda s: s.lock_order)
        statements = [statement for s in group for statement in s.statements]
        # A lock a member takes again is already held: only first takings can wait.
        taken = list(dict.fromkeys(key for s in group for key in s.lock_order))
        if taken != sorted(taken):
            statements.insert(0, _lock_statement(sorted(taken)))
        try:
            self._execute(_committed_as(statements, group))
        except OutcomeUnknown:
            # It may have committed: run alone, a member's jobs could be stored twice. Each
            # member raises it to its own caller, which knows what to do with its jobs.
            for member in group:
                if member is not mine:
                    member.outcome = "unknown"
                    member.done.set()
            raise
        except BaseException:
            # Nothing of the group was committed: each member finds out alone what its own
            # statements do (a refusal, a conflict, an outage).
            for member in group:
                if member is not mine:
                    member.outcome = "alone"
                    member.done.set()
            return False
        self.groups_committed += 1
        return True

    def _alone(self, submission: _Submission) -> None:
        self._execute(_committed_as(submission.statements, [submission]))
        self._publish(submission.jobs)


def _committed_as(statements: Statements, members: Sequence[_Submission]) -> Statements:
    """The statements, first told not to wait for the WAL flush when no member needs it."""
    if any(member.durable for member in members):
        return statements
    return [_SKIP_FLUSH, *statements]


def _lock_statement(keys: Sequence[tuple[int, int]]) -> tuple[str, list]:
    """Take these advisory locks (held until commit), one statement each, in the given order."""
    sql = ";\n".join("SELECT pg_advisory_xact_lock(%s, %s)" for _ in keys)
    return sql, [part for key in keys for part in key]
