"""A worker whose broker went away tries again within a second, not after Celery's 2, 4, 6 s:
realtime and api jobs promise a start within seconds."""

from __future__ import annotations

import logging
import re
from types import SimpleNamespace

import pytest
from kombu import Connection
from kombu.exceptions import OperationalError

from renq_site.celery import app
from renq_site.worker_consumer import RECONNECT_MAX_S, PromptConsumer

from .helpers import free_port


def consumer(name: str) -> PromptConsumer:
    """The consumer a worker builds, outside a worker (no pool, no event loop)."""
    return PromptConsumer(
        lambda *_: None, app=app, hostname=name, controller=SimpleNamespace(use_eventloop=False)
    )


@pytest.fixture
def three_retries(monkeypatch):
    monkeypatch.setitem(app.conf, "broker_connection_max_retries", 3)


def test_the_workers_consumer_retries_a_lost_broker_within_a_second(three_retries, caplog):
    assert app.conf.worker_consumer == "renq_site.worker_consumer:PromptConsumer"
    reconnecting = consumer("reconnect-test")
    reconnecting.first_connection_attempt = False  # a connection lost after the worker started
    nowhere = Connection(f"amqp://guest:guest@127.0.0.1:{free_port()}//", connect_timeout=1)

    with caplog.at_level(logging.ERROR), pytest.raises(OperationalError):
        reconnecting.ensure_connected(nowhere)

    # Celery words a wait under a second as "now".
    said = re.findall(r"Trying again (now|in ([\d.]+) seconds?)", caplog.text)
    waits = [float(seconds or 0) for _, seconds in said]
    assert len(waits) == 3, caplog.text
    assert max(waits) <= RECONNECT_MAX_S


def test_the_workers_consumer_does_not_wait_for_mingle():
    steps = consumer("mingle-test").blueprint.steps.values()
    mingle = next(step for step in steps if step.label == "Mingle")
    assert not mingle.enabled
