"""Keeping this worker's claims alive: a claim is a lease that its worker renews while it
holds the job, so a hung, cut-off or dead host's jobs are taken over within seconds (the
control worker's `take_over_lapsed_leases`), while a live one keeps its jobs however long a
batch or a chunked generation runs.

One keeper per process, on its own thread with its own Postgres session: it renews while the
process is inside a task that holds claims (`holding()`), by worker identity, so it needs no
list of tokens and renews nothing that was taken over (the takeover moved those rows to
another worker, or back to queued), nor a claim older than the database's start (a crash may
have undone its store: JobQuerySet.renew_leases). A frozen process renews nothing; when it
wakes, its late stores match no row (the claim token changed) and its results are dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterator

from django.conf import settings
from django.db import DatabaseError, InterfaceError, close_old_connections, connection

from inference.models import Job
from inference.workers import worker_identity

logger = logging.getLogger(__name__)

# Renewals per lease: a lease survives a few missed renewals (a slow Postgres, a long GIL
# hold) before it lapses.
RENEWALS_PER_LEASE = 4


class LeaseKeeper:
    """Renews the leases of the jobs this process holds, every lease_s / RENEWALS_PER_LEASE."""

    def __init__(self, lease_s: float | None = None):
        self._lease_s = lease_s
        self._holders = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._interval_s = 0.0  # between the thread's renewals
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._pid = 0

    @property
    def lease_s(self) -> float:
        return self._lease_s or settings.RENQ_LEASE_S

    @contextlib.contextmanager
    def holding(self) -> Iterator[None]:
        """While inside, this process may hold claims: they are renewed."""
        self._ensure_thread()
        with self._lock:
            self._holders += 1
        if self._interval_s != self.lease_s / RENEWALS_PER_LEASE:
            self._wake.set()  # the lease setting changed: renew on the new interval from now
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1

    def renew_now(self) -> int:
        """Renew this process's leases once (the thread does so on its own)."""
        return Job.objects.renew_leases(worker_identity(), self.lease_s)

    def _ensure_thread(self) -> None:
        if self._thread is not None and self._pid == os.getpid():
            return
        with self._lock:
            if self._thread is not None and self._pid == os.getpid():
                return
            # A forked child inherits the object, not the thread.
            self._pid, self._holders, self._wake = os.getpid(), 0, threading.Event()
            self._thread = threading.Thread(
                target=self._run, name="renq-lease-keeper", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """End the thread and its Postgres session (a process about to drop its database)."""
        thread, self._thread = self._thread, None
        if thread is not None and self._pid == os.getpid():
            self._stopping = True
            self._wake.set()
            thread.join(timeout=10)
            self._stopping = False

    def _run(self) -> None:
        while True:
            self._interval_s = self.lease_s / RENEWALS_PER_LEASE
            self._wake.wait(self._interval_s)
            self._wake.clear()
            if self._stopping:
                connection.close()
                return
            if self._holders <= 0:
                connection.close()  # no Postgres session held open by an idle worker
                continue
            try:
                close_old_connections()
                self.renew_now()
            except (DatabaseError, InterfaceError):
                # The lease may lapse and the job be taken over: that is what a lease is for.
                logger.warning("could not renew this worker's leases", exc_info=True)
                connection.close()


lease_keeper = LeaseKeeper()
