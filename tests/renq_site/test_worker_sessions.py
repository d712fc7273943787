"""The worker keeps its Postgres session from one task to the next: Celery's Django fixup
force-closes connections around every task unless told otherwise, and a fresh session per
task was half of an idle realtime job's scheduler overhead."""

from __future__ import annotations

import pytest
from celery.fixups.django import DjangoWorkerFixup
from celery.signals import task_prerun
from django.db import connection

from renq_site.celery import app

pytestmark = pytest.mark.django_db(transaction=True)


def _task_boundary(fixup: DjangoWorkerFixup) -> None:
    """What a worker does between two tasks, in order."""
    task = app.tasks["inference.run_job"]
    fixup.on_task_postrun(sender=task)
    fixup.on_task_prerun(sender=task)
    task_prerun.send(sender=task, task_id="t", task=task, args=(), kwargs={})


def test_a_task_boundary_keeps_the_session_within_conn_max_age(monkeypatch):
    import inference.tasks  # noqa: F401 - connects the task_prerun handler

    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    connection.close()
    connection.ensure_connection()
    session = connection.connection
    fixup = DjangoWorkerFixup(app)
    for _ in range(3):
        _task_boundary(fixup)
    assert connection.connection is session
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert connection.connection is session


def test_a_session_past_conn_max_age_is_replaced_at_the_next_task(monkeypatch):
    import inference.tasks  # noqa: F401

    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    connection.close()
    connection.ensure_connection()
    session = connection.connection
    connection.close_at = 0  # as if 60 s had passed
    _task_boundary(DjangoWorkerFixup(app))
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    assert connection.connection is not session


def test_a_kept_session_is_health_checked_at_most_once_a_second(monkeypatch):
    import inference.tasks  # noqa: F401

    # The check is a SELECT 1 round trip before a task's first query: at idle every task is
    # one realtime job, so it runs once a second, not before every task.
    monkeypatch.setitem(connection.settings_dict, "CONN_MAX_AGE", 60)
    monkeypatch.setitem(connection.settings_dict, "CONN_HEALTH_CHECKS", True)
    connection.close()
    connection.ensure_connection()
    checks = []
    is_usable = connection.is_usable
    monkeypatch.setattr(connection, "is_usable", lambda: checks.append(1) or is_usable())
    fixup = DjangoWorkerFixup(app)

    def task() -> None:
        _task_boundary(fixup)
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    for _ in range(5):
        task()
    assert len(checks) == 1
    session, checked_at = connection.renq_checked
    connection.renq_checked = (session, checked_at - 1.5)  # as if checked 1.5 s ago
    task()
    assert len(checks) == 2
