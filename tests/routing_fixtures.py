"""Routing fixtures, a plugin of tests/conftest.py shared by every package's tests: the fake
upstream (a real HTTP server process), backends and routes, and I/O workers (thread-pool Celery
workers on the test.io.<tier> queues)."""

from __future__ import annotations

import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, start_workers, stop_workers

FAKE_UPSTREAM = Path(__file__).parent / "routing" / "fake_upstream.py"
FAKE_API_KEY_ENV = "RENQ_TEST_FAKE_API_KEY"
FAKE_API_KEY = "sk-test-fake"


class FakeUpstream:
    def __init__(self):
        self.proc = subprocess.Popen(
            [sys.executable, str(FAKE_UPSTREAM), "--port", "0"],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        line = self.proc.stdout.readline()
        if not line.startswith("READY "):
            self.proc.kill()
            raise RuntimeError(f"fake upstream did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def base_url(self, name: str) -> str:
        return f"{self.url}/{name}/v1"

    def script(self, name: str, **behaviour) -> None:
        requests.post(f"{self.url}/_script/{name}", json=behaviour, timeout=5).raise_for_status()

    def reset(self) -> None:
        requests.post(f"{self.url}/_reset", timeout=5).raise_for_status()

    def calls(self, name: str | None = None) -> list[dict]:
        calls = requests.get(f"{self.url}/_calls", timeout=5).json()["calls"]
        return [c for c in calls if name is None or c["name"] == name]

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="session")
def _fake_upstream_process():
    upstream = FakeUpstream()
    yield upstream
    upstream.stop()


@pytest.fixture
def upstream(_fake_upstream_process, monkeypatch):
    """The fake upstream, with no scripts and no recorded calls."""
    monkeypatch.setenv(FAKE_API_KEY_ENV, FAKE_API_KEY)
    _fake_upstream_process.reset()
    return _fake_upstream_process


@pytest.fixture
def make_backend(db, upstream):
    from routing.models import Backend

    def make(name: str, kind: str = "openai", **fields):
        defaults = dict(
            kind=kind,
            service_kinds=["embedding", "reranker", "llm"],
            timeout_s=5.0,
            connect_timeout_s=1.0,
        )
        if kind == "openai":
            defaults.update(
                base_url=upstream.base_url(name),
                model_name=f"{name}-model",
                api_key_env=FAKE_API_KEY_ENV,
            )
        defaults.update(fields)
        return Backend.objects.create(name=name, **defaults)

    return make


@pytest.fixture
def make_route(db):
    from routing.models import Route, RouteEntry

    def make(service, *entries):
        """entries: (backend, order) or (backend, order, weight)."""
        route = Route.objects.create(service=service)
        for backend, order, *weight in entries:
            RouteEntry.objects.create(
                route=route, backend=backend, order=order, weight=weight[0] if weight else 100
            )
        return route

    return make


@pytest.fixture
def free_and_paid(make_backend):
    """A free cloud backend and a paid one, both on the fake upstream."""
    free = make_backend("free")
    paid = make_backend(
        "paid", cost_per_1k_input=Decimal("0.02"), cost_per_1k_output=Decimal("0.06")
    )
    return free, paid


def purge_io_queues() -> None:
    from inference.dispatch.queues import io_queues
    from renq_site.celery import app

    with app.connection_for_write() as conn:
        channel = conn.channel()
        for name in io_queues():
            app.amqp.queues[name](channel).declare()
            channel.queue_purge(name)


IO_WORKER_COUNT = 3


@pytest.fixture(scope="session")
def io_workers(django_db_setup, django_db_blocker):
    """Three I/O worker processes (thread pools), as production runs them, all at once."""
    import os

    from inference.dispatch.queues import io_queues

    os.environ[FAKE_API_KEY_ENV] = FAKE_API_KEY  # inherited by the worker processes
    purge_io_queues()
    workers = start_workers(
        *(f"io{i}" for i in range(IO_WORKER_COUNT)),
        services=(),
        concurrency=8,
        extra_queues=tuple(io_queues()),
        pool="threads",
    )
    yield workers
    stop_workers(workers)
    purge_io_queues()


@pytest.fixture
def gpu_consumer():
    """attach(service_name): a real consumer on the service's tier queues, which is what
    RabbitMQ counts for a GPU worker; detach(): its connection closes, as when a worker dies.
    It takes at most one message and never acks it, so closing hands the message back."""
    from kombu import Consumer

    from inference.dispatch.broker import forget_consumer_counts
    from inference.dispatch.queues import service_tier_queues
    from renq_site.celery import app

    class Attached:
        def __init__(self):
            self.connections = []

        def attach(self, service_name: str) -> None:
            connection = app.connection_for_write()
            channel = connection.channel()
            queues = [app.amqp.queues[name](channel) for name in service_tier_queues(service_name)]
            for queue in queues:
                queue.declare()
            consumer = Consumer(
                channel, queues, auto_declare=False, callbacks=[lambda body, message: None]
            )
            consumer.qos(prefetch_count=1)
            consumer.consume()
            self.connections.append(connection)
            forget_consumer_counts()

        def detach(self) -> None:
            while self.connections:
                self.connections.pop().close()
            forget_consumer_counts()

    attached = Attached()
    yield attached
    attached.detach()
