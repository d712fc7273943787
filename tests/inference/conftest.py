"""The front door as users meet it, shared by the OpenAI front door's tests and the Batch API's
(built on it): a real ASGI web process (gunicorn + uvicorn worker, as `make web` runs it)
against the test database, a real GPU worker, and the control queue's consumer. The official
`openai` client fixture lives in openai_api/conftest.py (see there)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import WorkerProcess
from tests.renq_site.helpers import asgi_web_server


@pytest.fixture(scope="session")
def front_door_url(django_db_setup) -> Iterator[str]:
    """`gunicorn renq_site.asgi:application -k uvicorn_worker.UvicornWorker` on a free port."""
    with asgi_web_server("test-oai-web") as url:
        yield url


@pytest.fixture
def gpu_worker(celery_worker_process) -> WorkerProcess:
    """The suite's one GPU worker for the test services. Not a second one: two workers on the
    same queues would split other tests' batches between them."""
    return celery_worker_process


@pytest.fixture(scope="session")
def control_worker(django_db_setup) -> Iterator[WorkerProcess]:
    """The control queue's consumer, which advances batches (threads: no model to load)."""
    from inference.dispatch.queues import control_queue

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
