"""/healthz and /readyz against the real PostgreSQL, RabbitMQ and Redis; each dependency's
failure is made in-process (a closed port), never by stopping a service other tests use."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from renq_site import health


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port that refuses connections: bound (so nobody else takes it) but not listening."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts TCP connections and then never says a word (a hung service)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield sock.getsockname()[1]


@pytest.fixture
def broker_at(monkeypatch):
    """Point the Celery app's broker somewhere else, for this test only."""
    from renq_site.celery import app

    # The environment wins over app.conf in Celery's broker URL lookup.
    monkeypatch.delenv("CELERY_BROKER_URL", raising=False)
    monkeypatch.delenv("CELERY_BROKER_READ_URL", raising=False)

    def point(url: str) -> None:
        monkeypatch.setitem(app.conf, "broker_url", url)

    return point


def test_healthz_answers_without_touching_dependencies(client):
    # No django_db mark: any database query here would fail the test.
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_ok_when_every_dependency_answers(client):
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json() == {
        "status": "ok",
        "checks": {"database": "ok", "migrations": "ok", "broker": "ok", "redis": "ok"},
        "warnings": [],
    }
    assert "no-cache" in response["Cache-Control"]


@pytest.mark.django_db
def test_readyz_stays_ready_and_names_a_backend_whose_key_is_unset(
    client, make_backend, monkeypatch
):
    monkeypatch.delenv("RENQ_TEST_UNSET_KEY", raising=False)
    make_backend("local-gpu", kind="local")
    make_backend("keyless", api_key_env="RENQ_TEST_UNSET_KEY")
    make_backend("keyed")
    response = client.get("/readyz")
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "ok"
    assert response.json()["warnings"] == [
        "backend keyless: unusable, never chosen: environment variable RENQ_TEST_UNSET_KEY is "
        "not set"
    ]


@pytest.mark.django_db
def test_readyz_names_the_broker_when_rabbitmq_refuses(client, broker_at, closed_port):
    broker_at(f"amqp://guest:guest@127.0.0.1:{closed_port}//")
    started = time.monotonic()
    response = client.get("/readyz")
    assert time.monotonic() - started < 5
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "unavailable"
    assert body["checks"]["broker"].startswith("error:")
    assert {body["checks"][name] for name in ("database", "migrations", "redis")} == {"ok"}


@pytest.mark.django_db
def test_readyz_names_redis_when_redis_refuses(client, settings, closed_port):
    settings.RENQ_REDIS_URL = f"redis://127.0.0.1:{closed_port}/0"
    response = client.get("/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["redis"].startswith("error:")
    assert checks["broker"] == "ok"


@pytest.mark.django_db
def test_readyz_names_the_database_when_postgres_refuses(client, closed_port, monkeypatch):
    from django.db import connection

    # The checks run on their own thread, whose new connection reads this same settings dict;
    # the test's own open connection is unaffected.
    monkeypatch.setitem(connection.settings_dict, "PORT", str(closed_port))
    response = client.get("/readyz")
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"].startswith("error:")
    assert checks["migrations"] == "skipped: database failed"
    assert checks["broker"] == checks["redis"] == "ok"


@pytest.mark.django_db
def test_readyz_names_unapplied_migrations(client, monkeypatch):
    class PendingMigrationExecutor(health.MigrationExecutor):
        def migration_plan(self, targets, clean_start=False):
            return [(self.loader.graph.nodes[("inference", "0001_initial")], False)]

    monkeypatch.setattr(health, "MigrationExecutor", PendingMigrationExecutor)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["migrations"].startswith("error:")
    assert "1 unapplied" in response.json()["checks"]["migrations"]


@pytest.mark.django_db
def test_readyz_answers_in_time_when_the_broker_hangs(client, broker_at, silent_port):
    broker_at(f"amqp://guest:guest@127.0.0.1:{silent_port}//")
    started = time.monotonic()
    response = client.get("/readyz")
    assert time.monotonic() - started < 5
    assert response.status_code == 503
    assert response.json()["checks"]["broker"].startswith("error:")


def test_run_checks_gives_up_on_a_check_at_the_deadline():
    def hangs() -> None:
        time.sleep(3)

    def breaks() -> None:
        raise ValueError("boom")

    started = time.monotonic()
    results = health.run_checks([[("slow", hangs)], [("broken", breaks)]], deadline_s=0.5)
    assert time.monotonic() - started < 1.5
    assert results == {
        "slow": "error: no answer within 0.5 s",
        "broken": "error: ValueError: boom",
    }
