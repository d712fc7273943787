"""The front door as users meet it: a real ASGI web process (gunicorn + uvicorn worker, as
`make web` runs it) against the test database, a real GPU worker, and the official `openai`
client pointed at it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from tests.conftest import WorkerProcess
from tests.renq_site.helpers import VENV_BIN, ChildProcess, child_database_url, free_port


@pytest.fixture(scope="session")
def front_door_url(django_db_setup) -> Iterator[str]:
    """`gunicorn renq_site.asgi:application -k uvicorn_worker.UvicornWorker` on a free port."""
    port = free_port()
    web = ChildProcess(
        "test-oai-web",
        [
            str(VENV_BIN / "gunicorn"),
            "renq_site.asgi:application",
            "-k",
            "uvicorn_worker.UvicornWorker",
            "-b",
            f"127.0.0.1:{port}",
            "-w",
            "1",
        ],
        env={"DATABASE_URL": child_database_url()},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        web.wait_until(lambda: requests.get(f"{url}/healthz", timeout=1).ok, "front door", 30)
        yield url
    finally:
        web.stop()


@pytest.fixture
def gpu_worker(celery_worker_process) -> WorkerProcess:
    """The suite's one GPU worker for the test services. Not a second one: two workers on the
    same queues would split other tests' batches between them."""
    return celery_worker_process


@pytest.fixture(scope="session")
def control_worker(django_db_setup) -> Iterator[WorkerProcess]:
    """The control queue's consumer, which advances batches (threads: no model to load)."""
    from inference.queues import control_queue

    worker = WorkerProcess(
        services=(), extra_queues=(control_queue(),), pool="threads", concurrency=4, name="oai-ctl"
    )
    yield worker
    worker.stop()


@pytest.fixture
def services(make_service):
    return {kind: make_service(kind) for kind in ("embedding", "reranker", "llm")}


@pytest.fixture
def unserved(make_service) -> str:
    """An embedding service no worker consumes: its jobs stay queued."""
    return make_service("embedding", name="unserved-embedding").name


@pytest.fixture
def tenant_key(make_tenant) -> str:
    return make_tenant("oai-tenant")[1]


@pytest.fixture
def client(front_door_url, tenant_key, services):
    """The official SDK, as users configure it; no retries, so errors are seen as sent."""
    from openai import OpenAI

    return OpenAI(base_url=f"{front_door_url}/v1", api_key=tenant_key, max_retries=0, timeout=60)
