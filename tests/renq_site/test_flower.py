"""Flower behind basic auth, with a real Celery worker: no login, no API; with it, Flower
lists the worker and the queue it consumes."""

from __future__ import annotations

import os
import secrets
import sys
import time

import pytest
import requests

from .helpers import ChildProcess, child_database_url, free_port

pytestmark = pytest.mark.worker

CELERY = [sys.executable, "-m", "celery", "-A", "renq_site"]
DEADLINE_S = 50  # the whole test, start-up included


def test_flower_api_needs_basic_auth_and_then_lists_the_worker(django_db_setup, monkeypatch):
    # Flower reads FLOWER_* from its environment: only the command line may open it here.
    for name in [name for name in os.environ if name.startswith("FLOWER_")]:
        monkeypatch.delenv(name)
    started = time.monotonic()
    run = secrets.token_hex(4)
    queue = f"{os.environ.get('RENQ_QUEUE_PREFIX', 'test.')}flowertest-{run}"
    worker_name = f"flowertest-{run}"
    login = ("ops", secrets.token_urlsafe(12))
    port = free_port()
    url = f"http://127.0.0.1:{port}"

    worker = ChildProcess(
        "test-flower-worker",
        [*CELERY, "worker", "-Q", queue, "-n", f"{worker_name}@%h", "--pool", "solo"]
        + ["--without-mingle", "--without-gossip", "-E", "-l", "info"],
        env={"DATABASE_URL": child_database_url()},
    )
    flower = ChildProcess(
        "test-flower",
        [*CELERY, "flower", f"--port={port}", "--address=127.0.0.1"]
        + [f"--basic-auth={login[0]}:{login[1]}"],
    )
    try:

        def remaining() -> float:
            return max(1.0, DEADLINE_S - (time.monotonic() - started))

        flower.wait_until(
            lambda: requests.get(f"{url}/healthcheck", timeout=1).ok, "flower", remaining()
        )
        assert requests.get(f"{url}/api/workers", timeout=5).status_code == 401
        wrong = requests.get(f"{url}/api/workers", auth=(login[0], "wrong"), timeout=5)
        assert wrong.status_code == 401
        assert requests.get(f"{url}/", timeout=5).status_code == 401

        worker.wait_until(lambda: " ready." in worker.log_path.read_text(), "worker", remaining())
        seen: dict = {}

        def flower_lists_the_worker_and_its_queue() -> bool:
            # A refresh asks each worker several inspect questions with a short timeout; on a
            # busy machine some answers miss it and the worker is listed without them. Ask again.
            response = requests.get(
                f"{url}/api/workers", params={"refresh": 1}, auth=login, timeout=5
            )
            assert response.status_code == 200, response.text
            seen.update(response.json())
            return any(
                name.startswith(f"{worker_name}@") and "active_queues" in info
                for name, info in seen.items()
            )

        flower.wait_until(
            flower_lists_the_worker_and_its_queue, "flower listing the worker", remaining()
        )
        (info,) = [info for name, info in seen.items() if name.startswith(f"{worker_name}@")]
        assert queue in [q["name"] for q in info["active_queues"]]
    finally:
        flower.stop()
        worker.stop()
        _delete_queue(queue)


def _delete_queue(queue: str) -> None:
    """The worker declared a durable queue of its own; leave the broker as it was."""
    from renq_site.celery import app

    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)
