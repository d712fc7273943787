"""Fixtures of the chaos suite: fault proxies in front of PostgreSQL, RabbitMQ and Redis, and
renq's processes (gunicorn, a GPU worker for the noop kind, the control worker with the sweep
every second) started once per module, reaching the services only through the proxies.

Environment: RENQ_CHAOS_FULL=1 runs the full-size forms (`make chaos`);
RENQ_CHAOS_REAL_SERVICES=1 also runs the forms that stop and start the machine's real
PostgreSQL, RabbitMQ and Redis (never in `make test`: CI and other developers share them).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

from tests.chaos.cluster import CHAOS_QUEUE_PREFIX, Clients, Cluster, Proxies

CHAOS_FULL = os.environ.get("RENQ_CHAOS_FULL") == "1"
REAL_SERVICES = os.environ.get("RENQ_CHAOS_REAL_SERVICES") == "1"


def purge_chaos_queues() -> None:
    from inference.dispatch.queues import (
        control_queue,
        dead_letter_queue,
        io_queues,
        service_queues,
    )
    from renq_site.celery import app

    names = [
        *service_queues("noop"),
        *service_queues("embedding"),
        *io_queues(),
        control_queue(),
    ]
    with app.connection_for_write() as conn:
        channel = conn.channel()
        for name in names:
            app.amqp.queues[name](channel).declare()
            channel.queue_purge(name)
        app.amqp.queues[dead_letter_queue()](channel).declare()


@pytest.fixture(scope="module", autouse=True)
def _chaos_queue_prefix():
    """Queues of their own: the session's other workers (tests/conftest.py, the routing
    fixtures' I/O workers) consume the test prefix's queues and must not serve, or sweep, the
    chaos scenarios' jobs around the faults."""
    from django.conf import settings

    from inference.dispatch.broker import forget_consumer_counts

    saved = settings.RENQ_QUEUE_PREFIX
    settings.RENQ_QUEUE_PREFIX = CHAOS_QUEUE_PREFIX
    forget_consumer_counts()
    yield
    settings.RENQ_QUEUE_PREFIX = saved
    forget_consumer_counts()


@pytest.fixture(scope="module")
def proxies():
    p = Proxies()
    yield p
    p.stop()


@pytest.fixture(scope="module")
def cluster(django_db_setup, django_db_blocker, proxies):
    """gunicorn + the noop GPU worker + the control worker (beat, sweep every 1 s)."""
    purge_chaos_queues()
    c = Cluster(proxies)
    try:
        c.web()
        c.control_worker(wait=False)
        c.gpu_worker()
        c.wait_ready("control")
        yield c
    finally:
        c.stop_all()
        purge_chaos_queues()


@dataclass
class Scenario:
    cluster: Cluster
    proxies: Proxies
    tenant: object
    key: str
    service: object
    clients: Clients


@pytest.fixture
def scenario(cluster, proxies, transactional_db, make_tenant, make_service):
    """A fresh tenant and noop service (committed, so the processes see them), every proxy
    passing, and the GPU worker running (a scenario may have killed it)."""
    proxies.restore_all()
    if "gpu" not in cluster.children or cluster.children["gpu"].proc.poll() is not None:
        cluster.gpu_worker()
    service = make_service(
        "noop",
        batch_size=8,
        batch_timeout=0.02,
        max_queue_size=100_000,
        queue_timeout=900,
        total_timeout=900,
    )
    tenant, key = make_tenant("chaos", plan="pro", tier="api")
    # The web processes cache services by name and look for configuration changes once a
    # second (inference.intake.lookups): the previous scenario's "noop" (gone with the flush, which
    # sends no signal) must not be used for the first submissions.
    from inference.intake.lookups import RECHECK_INTERVAL_S

    time.sleep(RECHECK_INTERVAL_S + 0.5)
    yield Scenario(cluster, proxies, tenant, key, service, Clients(cluster.web_url, key))
    proxies.restore_all()
