"""Scaling across hosts: `renq_autoscale --apply` on a spare host starts a worker there when
a backlog builds up, and stops it once the backlog has drained.

Topology (its own, smaller than test_host_faults'): gpu1 runs a noop worker, web the API,
ctl beat and the sweeps; gpu-spare runs only the autoscaler (`--min 0`), whose workers start
inside gpu-spare's namespace and under its hostname, so a job's `worker` says where it ran.
"""

from __future__ import annotations

import re
import shutil
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from django.utils import timezone

from inference.dispatch.scaling import workers_dir
from inference.models import Job, JobStatus
from tests.chaos.cluster import Clients, ledger, noop_job, wait_for
from tests.chaos.conftest import purge_chaos_queues
from tests.cluster.conftest import CHILD_SETTINGS, CLUSTER_FULL
from tests.cluster.hosts import HostCluster
from tests.cluster.network import (
    NETNS_PREFIX,
    HostNetwork,
    privilege_problem,
    remove_leftovers,
    signal_namespace,
)
from tests.renq_site.helpers import RUN_DIR

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.worker,
    pytest.mark.cluster_full,
    pytest.mark.skipif(
        not CLUSTER_FULL, reason="full-size form: RENQ_CLUSTER_FULL=1 (make cluster)"
    ),
]

SPARE = "gpu-spare"
REPORT_PATH = RUN_DIR / "cluster-report.txt"
# Each job sleeps this long, so gpu1 alone takes a while over the backlog.
SLEEP_MS = 400
FIRST_BACKLOG = 40
# While the spare host has run nothing, the backlog is topped up to stay at least this deep:
# its worker finds work however long it took to start.
KEEP_QUEUED = 12
TOP_UP = 16
MOST_JOBS = 400
# Generous bounds on a loaded machine, never expected to be reached.
START_BOUND_S = 180
STOP_BOUND_S = 90


@pytest.fixture(scope="module")
def hosts(django_db_setup, django_db_blocker):
    """Hosts gpu1 (a noop worker), web, ctl and gpu-spare (nothing yet). Always removed,
    processes first."""
    problem = privilege_problem()
    if problem:
        pytest.skip(f"multi-host tests: {problem}")
    remove_leftovers()
    purge_chaos_queues()
    cluster = HostCluster(HostNetwork(), **CHILD_SETTINGS)
    try:
        for name in ("gpu1", SPARE, "web", "ctl"):
            cluster.add_host(name)
        with django_db_blocker.unblock():
            cluster.gpu_worker("gpu1", ["noop"])
            cluster.control_worker("ctl")
            cluster.web("web")
            cluster.wait_ready("gpu1")
            cluster.wait_ready("ctl")
        yield cluster
    finally:
        cluster.remove()
        purge_chaos_queues()


def spare_hostname(cluster: HostCluster) -> str:
    return cluster.hosts[SPARE].link.hostname


@pytest.fixture
def spare_pidfiles(hosts):
    """The spare host's worker directory, emptied before and after; whatever the autoscaler
    started there is killed afterwards, even when the test fails."""
    directory = workers_dir(spare_hostname(hosts))
    shutil.rmtree(directory, ignore_errors=True)
    try:
        yield directory
    finally:
        hosts.stop(f"autoscaler-{SPARE}")
        # The workers run in sessions of their own, apart from the autoscaler's group.
        signal_namespace(hosts.hosts[SPARE].link.netns, signal.SIGKILL)
        shutil.rmtree(directory, ignore_errors=True)


def host_of(worker: str) -> str:
    """The host a job's `worker` (hostname:pid) ran on; hostnames are the namespaces'."""
    return worker.split(":", 1)[0].removeprefix(NETNS_PREFIX)


def listed_pids(directory: Path) -> set[int]:
    pids = set()
    for pidfile in directory.glob("noop-*.pid"):
        text = pidfile.read_text().strip() if pidfile.exists() else ""
        if text.isdigit():
            pids.add(int(text))
    return pids


def exited(pid: int) -> bool:
    """Gone, or a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def batch_jobs(first: int, n: int) -> list[tuple[str, dict]]:
    return [
        noop_job(f"autoscale {i}", sleep_ms=SLEEP_MS, priority="batch")
        for i in range(first, first + n)
    ]


def queued_jobs(tenant) -> int:
    return Job.objects.filter(tenant=tenant, status=JobStatus.QUEUED).count()


def served_by_spare(tenant, hostname: str) -> bool:
    workers = Job.objects.filter(tenant=tenant, worker__startswith=f"{hostname}:")
    return workers.exclude(status=JobStatus.QUEUED).exists()


def test_backlog_starts_a_worker_on_the_spare_host_and_stops_it_after(
    hosts, spare_pidfiles, transactional_db, make_tenant, make_service
):
    """Idle, the spare host's autoscaler starts nothing; a backlog makes it start a worker
    there, which serves part of it (every job done once, none lost); once the backlog has
    drained, it stops that worker."""
    from inference.intake.lookups import RECHECK_INTERVAL_S

    make_service(
        "noop",
        batch_size=4,
        batch_timeout=0.02,
        worker_count=2,
        max_queue_size=100_000,
        queue_timeout=900,
        total_timeout=900,
    )
    tenant, key = make_tenant("autoscale", plan="pro", tier="api")
    time.sleep(RECHECK_INTERVAL_S + 0.5)  # the web's cache of services by name
    clients = Clients(hosts.web_url, key)
    hostname = spare_hostname(hosts)
    autoscaler = hosts.autoscaler(SPARE, ["noop"], watch_s=1, minimum=0)

    def passes_done() -> int:
        return autoscaler.log_tail(100_000).count("started 0, stopped 0")

    # Two full passes with nothing queued: the spare host stays empty.
    autoscaler.wait_until(lambda: passes_done() >= 2, "autoscaler's idle passes", 120)
    assert not listed_pids(spare_pidfiles), autoscaler.log_tail()

    backlog_at = time.monotonic()
    clients.run(batch_jobs(0, FIRST_BACKLOG))
    started: set[int] = set()

    def spare_worker_listed() -> bool:
        started.update(listed_pids(spare_pidfiles))
        return bool(started)

    assert wait_for(spare_worker_listed, START_BOUND_S, poll_s=0.2), autoscaler.log_tail()
    worker_up_s = time.monotonic() - backlog_at

    def spare_serving() -> bool:
        started.update(listed_pids(spare_pidfiles))
        if served_by_spare(tenant, hostname):
            return True
        if queued_jobs(tenant) < KEEP_QUEUED and len(clients.submissions) < MOST_JOBS:
            clients.run(batch_jobs(len(clients.submissions), TOP_UP))
        return False

    assert wait_for(spare_serving, START_BOUND_S, poll_s=0.5), autoscaler.log_tail()
    first_job_s = time.monotonic() - backlog_at

    report = ledger(
        f"autoscaler on {SPARE}, backlog={len(clients.submissions)}",
        tenant,
        clients.submissions,
        bound_s=300,
        started_at=backlog_at,
    )
    finished = Job.objects.filter(tenant=tenant, status=JobStatus.SUCCEEDED)
    by_host = Counter(host_of(w) for w in finished.values_list("worker", flat=True))
    drained_wall = max(finished.values_list("finished_at", flat=True), default=timezone.now())

    started.update(listed_pids(spare_pidfiles))
    stopped = wait_for(lambda: all(exited(pid) for pid in started), STOP_BOUND_S, poll_s=0.2)
    stop_after_drain_s = (timezone.now() - drained_wall).total_seconds()
    report.suite = "cluster"
    report.extra.update(
        by_host=dict(by_host),
        spare_workers=len(started),
        worker_listed_after_s=f"{worker_up_s:.1f}",
        spare_first_job_after_s=f"{first_job_s:.1f}",
        stopped_after_drain_s=f"{stop_after_drain_s:.1f}" if stopped else "NOT within bound",
    )
    line = report.line()
    print("\n" + line)
    REPORT_PATH.parent.mkdir(exist_ok=True)
    with open(REPORT_PATH, "a") as out:  # `make cluster` prints the file at the end
        out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")

    report.assert_ok()
    assert report.completed == report.accepted == len(clients.submissions), line
    assert by_host[SPARE] > 0 and by_host["gpu1"] > 0, line
    # At most the service's worker_count, whatever the backlog.
    assert 1 <= len(started) <= 2, line
    assert stopped, f"{line}\n{autoscaler.log_tail()}"
    # Stopped by the autoscaler (a warm shutdown), which kept running.
    assert re.search(r"stopped [1-9]", autoscaler.log_tail(100_000)), autoscaler.log_tail()
    assert hosts.running(f"autoscaler-{SPARE}"), autoscaler.log_tail()
    assert wait_for(lambda: not listed_pids(spare_pidfiles), 30), line
