"""A pool process starts its threads with no Postgres session of its main thread left open:
Celery's Django fixup, which runs after renq's start-up receiver, closes such a session by its
file descriptor and then again through the driver. A thread started in between could get that
number for a socket or file of its own and have it closed under it: in freshly forked pool
processes the head-start thread died with EBADF, and a claim read from a wrong socket for 8 s."""

from __future__ import annotations

import pytest
from django.db import connection

from inference import tasks
from inference.models import Service

pytestmark = pytest.mark.django_db(transaction=True)


def test_threads_start_after_the_main_threads_sessions_are_closed(monkeypatch, tmp_path):
    sessions_open_at_thread_start: list[bool] = []
    monkeypatch.setenv("RENQ_READY_DIR", str(tmp_path))

    def warm_with_a_query() -> list[str]:
        list(Service.objects.all())  # as the warm-up reads the services it loads
        return []

    monkeypatch.setattr(tasks, "warm_engines_for_consumed_queues", warm_with_a_query)
    monkeypatch.setattr(tasks, "keep_off_model_cores", lambda: None)
    monkeypatch.setattr(tasks, "freeze_startup_objects", lambda: None)
    monkeypatch.setattr(
        tasks._runner.head_starts,
        "listen",
        lambda _queues: sessions_open_at_thread_start.append(connection.connection is not None),
    )

    tasks._warm_worker_process()

    assert sessions_open_at_thread_start == [False]


@pytest.mark.parametrize("consumed", [{"embedding"}, set()])
def test_a_pool_process_that_runs_a_model_raises_its_priority_before_its_threads(
    monkeypatch, tmp_path, consumed
):
    calls: list[str] = []
    monkeypatch.setenv("RENQ_READY_DIR", str(tmp_path))
    monkeypatch.setattr(tasks, "consumed_service_names", lambda: consumed)
    monkeypatch.setattr(tasks, "raise_model_priority", lambda threads: calls.append("priority"))
    monkeypatch.setattr(tasks, "warm_engines_for_consumed_queues", lambda: [])
    monkeypatch.setattr(tasks, "keep_off_model_cores", lambda: None)
    monkeypatch.setattr(tasks, "freeze_startup_objects", lambda: None)
    monkeypatch.setattr(tasks._runner.head_starts, "listen", lambda _q: calls.append("threads"))

    tasks._warm_worker_process()

    # The control and I/O workers run no model: they keep the priority they were started with.
    assert calls == (["priority", "threads"] if consumed else ["threads"])
