"""The configuration change marker: how a running worker learns, cheaply, that services,
models, backends, routes, tier or plan policies changed, and reloads them without a restart.

    watcher = ConfigWatcher()            # once per process
    ...
    if watcher.changed():                # at most one indexed single-row read per interval
        reload_service_settings()

or, by hand: keep `stamp = config_last_update()` and ask `config_changed_since(stamp)`.

Saves and deletes through the ORM (the admin, the config loader, `create`/`save` in code) bump
the marker through signals; `QuerySet.update()` sends no signal, so code that updates
configuration rows in bulk calls `bump_config_change()` itself.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import time
from collections.abc import Iterator
from datetime import datetime

from django.db import DatabaseError, InterfaceError, connection
from django.db.models.signals import post_delete, post_save
from django.dispatch import Signal

from inference.config.models import (
    ConfigChange,
    ModelSpec,
    PlanPolicy,
    SchedulerSettings,
    ServiceModelLink,
)
from inference.models import ApiKey, Service, Tenant, rows_updated
from routing.models import Backend, Route, RouteEntry

# Upsert of the single row; the database's clock, so every host compares against one clock,
# and clock_timestamp() (not now()) so a long transaction does not stamp its start time.
_BUMP_SQL = """
INSERT INTO renq_config_configchange (id, version, last_update)
VALUES (1, 1, clock_timestamp())
ON CONFLICT (id) DO UPDATE
   SET version = renq_config_configchange.version + 1, last_update = clock_timestamp()
"""

# Set while the config loader applies a file: it bumps once at the end instead of per row.
_batched: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "renq_config_batched", default=False
)


# Sent in this process after every bump: its own caches need not wait for the next poll.
config_changed = Signal()


def bump_config_change() -> None:
    with connection.cursor() as cursor:
        cursor.execute(_BUMP_SQL)
    config_changed.send(sender=None)


@contextlib.contextmanager
def one_config_change() -> Iterator[None]:
    """Many saves, one bump (at the end, inside the caller's transaction)."""
    token = _batched.set(True)
    try:
        yield
    finally:
        _batched.reset(token)
    bump_config_change()


def config_last_update() -> datetime | None:
    """Database time of the latest configuration change; None before any."""
    return (
        ConfigChange.objects.filter(pk=ConfigChange.SINGLETON_PK)
        .values_list("last_update", flat=True)
        .first()
    )


def config_changed_since(ts: datetime | None) -> bool:
    """Whether the configuration changed after `ts` (a value config_last_update() returned;
    None = "never read": true once anything was ever configured). One single-row read."""
    last = config_last_update()
    return last is not None and (ts is None or last > ts)


def config_recheck_s() -> float:
    """How often (s) a process's caches of configuration look at the change marker: their
    staleness bound, RENQ_CONFIG_RECHECK_S (default 1). Read at each use, not at import: the
    test suite sets 0 (it recreates rows within a second) after Django has loaded this module."""
    return float(os.environ.get("RENQ_CONFIG_RECHECK_S", "1.0"))


class ConfigWatcher:
    """Per process: `changed()` is true once after each configuration change, and reads the
    marker at most every `min_interval_s` (default: config_recheck_s()), so a batch loop may
    call it before every batch."""

    def __init__(self, min_interval_s: float | None = None):
        self.min_interval_s = min_interval_s
        self._seen: datetime | None = None
        self._checked_at = 0.0
        self._primed = False

    def changed(self) -> bool:
        now = time.monotonic()
        interval = self.min_interval_s
        if interval is None:
            interval = config_recheck_s()
        if self._primed and now - self._checked_at < interval:
            return False
        self._checked_at = now
        try:
            last = config_last_update()
        except (DatabaseError, InterfaceError):
            if not self._primed:
                raise
            # Postgres is away: what was read before still serves (a commit after a submission
            # must not fail on a staleness check), and the look after the outage sees any change.
            return False
        if not self._primed:
            # The first look records where we stand; the process just loaded everything.
            self._primed, self._seen = True, last
            return False
        # Any move counts, backwards or to nothing too (a restored or emptied database): a
        # cache kept across it would hold rows that are gone.
        if last != self._seen:
            self._seen = last
            return True
        return False


def _on_config_saved(**_kwargs) -> None:
    if not _batched.get():
        bump_config_change()


def connect_signals() -> None:
    for model in (
        Service,
        # Tenants and keys too: the web processes cache them (inference.intake.lookups), and a
        # revoked key or a changed quota must take effect everywhere within a second.
        Tenant,
        ApiKey,
        ModelSpec,
        ServiceModelLink,
        SchedulerSettings,
        PlanPolicy,
        Backend,
        Route,
        RouteEntry,
    ):
        uid = f"renq-config-change-{model._meta.label_lower}"
        post_save.connect(_on_config_saved, sender=model, dispatch_uid=uid + "-save")
        post_delete.connect(_on_config_saved, sender=model, dispatch_uid=uid + "-delete")
    rows_updated.connect(_on_config_saved, dispatch_uid="renq-config-change-bulk-update")
