"""Liveness and readiness probes for load balancers, orchestrators and compose healthchecks.

`/healthz` says only that this process answers HTTP (restart it if not). `/readyz` says whether
it can do its work: PostgreSQL, RabbitMQ and Redis answer and every migration is applied (send
it no traffic if not). Neither needs credentials, and `/readyz` answers 200 or 503, never 500,
within READY_DEADLINE_S however a dependency fails. Its `warnings` name what an operator should
fix that leaves the process ready (e.g. a backend whose API key variable is unset).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import redis
from django.conf import settings
from django.db import connections
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

# Probes usually time out after 5 s; a black-holed host must not make us miss that.
READY_DEADLINE_S = 4.0
CONNECT_TIMEOUT_S = 2.0

Check = Callable[[], None]
# Conditions worth an operator's eye that leave this process ready, each giving its lines. The
# apps add theirs (AppConfig.ready), so renq_site imports none of them.
WARNING_SOURCES: list[Callable[[], list[str]]] = []


def add_warning_source(source: Callable[[], list[str]]) -> None:
    if source not in WARNING_SOURCES:
        WARNING_SOURCES.append(source)


def current_warnings() -> list[str]:
    warnings: list[str] = []
    for source in WARNING_SOURCES:
        try:
            warnings.extend(source())
        except Exception as exc:  # noqa: BLE001 - a warning's failure must not fail the probe
            warnings.append(f"{getattr(source, '__name__', source)}: {type(exc).__name__}: {exc}")
    return warnings


def check_database() -> None:
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def check_migrations() -> None:
    executor = MigrationExecutor(connections["default"])
    plan = executor.migration_plan(executor.loader.graph.leaf_nodes())
    if plan:
        raise RuntimeError(f"{len(plan)} unapplied, first {plan[0][0]}")


def check_broker() -> None:
    from renq_site.celery import app

    with app.connection_for_read(connect_timeout=CONNECT_TIMEOUT_S) as conn:
        # max_retries=0: one attempt; kombu sleeps 2 s before each retry.
        conn.ensure_connection(max_retries=0)


def check_redis() -> None:
    client = redis.Redis.from_url(
        settings.RENQ_REDIS_URL,
        socket_timeout=CONNECT_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
    )
    try:
        client.ping()
    finally:
        client.close()


# Checks in one group run one after the other (migrations need the database); groups run in
# parallel so the slowest dependency, not the sum of them, bounds the answer time.
CHECK_GROUPS: list[list[tuple[str, Check]]] = [
    [("database", check_database), ("migrations", check_migrations)],
    [("broker", check_broker)],
    [("redis", check_redis)],
]


def _run_group(group: list[tuple[str, Check]], results: dict[str, str]) -> None:
    try:
        failed = None
        for name, check in group:
            if failed:
                results[name] = f"skipped: {failed} failed"
                continue
            try:
                check()
                results[name] = "ok"
            except Exception as exc:  # noqa: BLE001 - any failure means "not ready", not a 500
                results[name] = f"error: {type(exc).__name__}: {exc}".strip()
                failed = name
    finally:
        # This thread's own database connection; the request thread's is left alone.
        connections.close_all()


def run_checks(
    groups: list[list[tuple[str, Check]]], deadline_s: float = READY_DEADLINE_S
) -> dict[str, str]:
    """Each check's outcome, "ok" or "error: ...", within deadline_s."""
    results: dict[str, str] = {}
    # Daemon threads: one stuck on a dead host neither delays the answer nor blocks shutdown.
    threads = [
        threading.Thread(target=_run_group, args=(group, results), daemon=True) for group in groups
    ]
    for thread in threads:
        thread.start()
    end = time.monotonic() + deadline_s
    for thread in threads:
        thread.join(max(0.0, end - time.monotonic()))
    snapshot = dict(results)
    return {
        name: snapshot.get(name, f"error: no answer within {deadline_s:g} s")
        for group in groups
        for name, _ in group
    }


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    checks = run_checks(CHECK_GROUPS)
    ready = all(outcome == "ok" for outcome in checks.values())
    # The warnings read the database: only when it answered (and within its deadline).
    warnings = current_warnings() if checks.get("database") == "ok" else []
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks, "warnings": warnings},
        status=200 if ready else 503,
    )
