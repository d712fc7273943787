"""Postgres sessions kept between requests and tasks, health-checked at most once a second.

Web lanes, the front door's database threads and workers keep their sessions (CONN_MAX_AGE).
With CONN_HEALTH_CHECKS, Django checks a kept session with a SELECT 1 round trip before the
first query of every request or task (and the front door would check before each of its
database calls): a round trip that a busy session, just used, does not need. Here a session
checked less than SESSION_CHECK_INTERVAL_S ago is trusted. One that broke since (a Postgres
restart) fails its next query: the request answers 503 with Retry-After, or the task's message
goes back to its queue, and Django replaces the session at the next request or task.
"""

from __future__ import annotations

import time

from django.db import close_old_connections, connections

SESSION_CHECK_INTERVAL_S = 1.0


def trust_recently_checked_sessions() -> None:
    """Right after Django's close_old_connections(): skip the health check of each session
    checked within SESSION_CHECK_INTERVAL_S; the others are checked by their first query."""
    now = time.monotonic()
    for conn in connections.all(initialized_only=True):
        if conn.connection is None or conn.health_check_done:
            continue  # closed (the next query connects afresh) or checked just now
        session, checked_at = getattr(conn, "renq_checked", (None, 0.0))
        if session is conn.connection and now - checked_at < SESSION_CHECK_INTERVAL_S:
            conn.health_check_done = True
        else:
            conn.renq_checked = (conn.connection, now)  # its first query checks it


def close_old_connections_checked_once_a_second() -> None:
    """What Django does at a request's start (drop sessions that broke or outlived
    CONN_MAX_AGE), with the health check of kept sessions at most once a second."""
    close_old_connections()
    trust_recently_checked_sessions()
