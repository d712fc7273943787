"""The chaos suite: faults injected under load into real processes, over real HTTP, loopback
only, bounded in time. Each scenario prints one line — accepted, completed, failed (with
reasons), lost (must be 0), duplicated (must be 0) — and asserts that every accepted job is
final within a bound.

CI runs the reduced forms inside `make test` (marker `chaos`); `make chaos` runs the full forms
(marker `chaos_full`, RENQ_CHAOS_FULL=1) and the ones that stop the machine's real services
(RENQ_CHAOS_REAL_SERVICES=1). Faults come from TCP proxies (tests/chaos/tcp_proxy.py): the
shared PostgreSQL, RabbitMQ and Redis are never stopped in `make test`.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from django.utils import timezone

from inference.engines.noop import POISON_TEXT
from inference.models import Job, JobStatus
from tests.chaos.cluster import REPORT_PATH, first_completion_after, ledger, noop_job, wait_for
from tests.chaos.conftest import CHAOS_FULL, REAL_SERVICES
from tests.chaos.tcp_proxy import postgres_too_many_clients

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

full = [
    pytest.mark.chaos_full,
    pytest.mark.skipif(not CHAOS_FULL, reason="full-size form: RENQ_CHAOS_FULL=1 (make chaos)"),
]
real = [
    pytest.mark.chaos_full,
    pytest.mark.skipif(
        not REAL_SERVICES,
        reason="stops the machine's real service: RENQ_CHAOS_REAL_SERVICES=1 (make chaos)",
    ),
]


def report_and_check(report) -> None:
    line = report.line()
    print("\n" + line)
    REPORT_PATH.parent.mkdir(exist_ok=True)
    with open(REPORT_PATH, "a") as out:  # `make chaos` prints the file at the end
        out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
    report.assert_ok()


def _running_jobs(tenant) -> int:
    return Job.objects.filter(tenant=tenant, status=JobStatus.RUNNING).count()


def busy_backlog(s, n: int, sleep_ms: int = 60) -> None:
    """Jobs the GPU worker is still working through when the fault comes (8 per batch)."""
    s.clients.run([noop_job(f"backlog {i}", sleep_ms=sleep_ms) for i in range(n)])
    assert wait_for(lambda: _running_jobs(s.tenant) > 0, 20, poll_s=0.01)


class LogWatch:
    """Counts a worker's log lines written since the fault began."""

    def __init__(self, s, name: str = "gpu"):
        self.path = s.cluster.children[name].log_path
        self.offset = self.path.stat().st_size

    def count(self, needle: str) -> int:
        with open(self.path, errors="replace") as log:
            log.seek(self.offset)
            return log.read().count(needle)


REQUEUED = "message goes back to its queue"
# Every accepted job final this soon after a fault ends: well under the lost-message sweep's
# bound (RENQ_LOST_MESSAGE_AFTER_S, set long for these processes), so a job that needed it —
# its message was taken and never handed back — fails the scenario instead of passing late.
# The broker scenarios allow 5 s more: jobs accepted during the outage wait for the outbox
# sweep (10 s after they were accepted).
SETTLED_WITHIN_S = 20.0


def _recovery(tenant, restored_wall, restored_mono, timeout_s: float) -> float | None:
    """Seconds from a fault's end to the first job completed after it (None: not in time)."""
    if not wait_for(lambda: first_completion_after(restored_wall, tenant) is not None, timeout_s):
        return None
    first = first_completion_after(restored_wall, tenant)
    return (first - restored_wall).total_seconds()


# --- 1. kill -9 a GPU worker with N jobs in flight -----------------------------------------


def kill_gpu_worker_in_flight(s, n: int, bound_s: float) -> None:
    # The worker (8 × 40 ms a batch) is slower than the clients: a backlog builds up.
    bodies = [noop_job(f"kill {i}", sleep_ms=40) for i in range(n)]
    s.clients.run(bodies, deadline_s=bound_s)
    # Every job accepted; kill with a batch mid-flight.
    assert wait_for(lambda: _running_jobs(s.tenant) > 0, 10, poll_s=0.01)
    in_flight = Job.objects.filter(tenant=s.tenant).exclude(status=JobStatus.SUCCEEDED).count()
    killed_at = time.monotonic()
    s.cluster.kill("gpu")
    s.cluster.gpu_worker()  # restarted, as a supervisor would
    restarted_s = time.monotonic() - killed_at
    report = ledger(f"kill -9 GPU worker, N={n}", s.tenant, s.clients.submissions, bound_s=bound_s)
    report.extra.update(in_flight_at_kill=in_flight, restart_s=f"{restarted_s:.1f}")
    report_and_check(report)
    assert report.accepted == n and report.completed == n


@pytest.mark.chaos
def test_kill_gpu_worker_with_jobs_in_flight(scenario):
    kill_gpu_worker_in_flight(scenario, n=200, bound_s=90)


@pytest.mark.parametrize("n", [1000])
@full[0]
@full[1]
def test_kill_gpu_worker_with_jobs_in_flight_full(scenario, n):
    kill_gpu_worker_in_flight(scenario, n=n, bound_s=300)


# --- 2. the broker away while jobs are submitted and run ---------------------------------


def broker_outage(s, outage_s: float, *, real_service: bool = False) -> None:
    busy_backlog(s, 40)
    rate, before_s, after_s = 12.0, 1.0, 4.0
    n = int(rate * (before_s + outage_s + after_s))
    load = s.clients.run_in_background(
        [noop_job(f"broker {i}", sleep_ms=5) for i in range(n)], rate_per_s=rate
    )
    time.sleep(before_s)
    watch = LogWatch(s)
    if real_service:
        subprocess.run(["rabbitmqctl", "stop_app"], check=True, capture_output=True)
    else:
        s.proxies.rabbitmq.cut()
    time.sleep(outage_s)
    if real_service:
        subprocess.run(["rabbitmqctl", "start_app"], check=True, capture_output=True)
    else:
        s.proxies.rabbitmq.restore()
    restored_wall, restored = timezone.now(), time.monotonic()
    recovery_s = _recovery(s.tenant, restored_wall, restored, timeout_s=30)
    load.join(120)
    report = ledger(
        f"broker {'stopped' if real_service else 'cut'} {outage_s:g} s",
        s.tenant,
        s.clients.submissions,
        bound_s=90,
        started_at=restored,
    )
    during = [x for x in s.clients.submissions if restored - outage_s <= x.at <= restored]
    report.extra.update(
        during_outage={
            code: sum(1 for x in during if x.status == code)
            for code in sorted({x.status for x in during})
        },
        recovery_s=f"{recovery_s:.2f}" if recovery_s is not None else "NONE",
        worker_connection_lost=watch.count("onnection to broker lost"),
    )
    report_and_check(report)
    assert recovery_s is not None and recovery_s < 20, report.line()
    assert report.final_after_s < SETTLED_WITHIN_S + 5, report.line()
    # Accepted into PostgreSQL (published later by the outbox sweep) or refused with 503.
    assert all(x.status in (202, 503) for x in during), report.line()


@pytest.mark.chaos
def test_broker_cut(scenario):
    broker_outage(scenario, outage_s=3)


@full[0]
@full[1]
def test_broker_cut_full(scenario):
    broker_outage(scenario, outage_s=10)


@real[0]
@real[1]
def test_rabbitmq_stopped_real(scenario):
    broker_outage(scenario, outage_s=10, real_service=True)


# --- 3. PostgreSQL away under load ----------------------------------------------------------


def _pg_cluster_name() -> str:
    return sorted(p.name for p in Path("/etc/postgresql").iterdir())[0]


def postgres_outage(s, outage_s: float, *, real_service: bool = False, crash: bool = False) -> None:
    """`crash`: the real server stops without a checkpoint (immediate mode) and recovers from
    its WAL when it starts, losing the commits that did not wait for the WAL flush."""
    busy_backlog(s, 40)
    rate, before_s, after_s = 12.0, 1.0, 4.0
    n = int(rate * (before_s + outage_s + after_s))
    load = s.clients.run_in_background(
        [noop_job(f"pg {i}", sleep_ms=5) for i in range(n)], rate_per_s=rate
    )
    time.sleep(before_s)
    watch = LogWatch(s)
    if real_service:
        stop = ["pg_ctlcluster", "--skip-systemctl-redirect", _pg_cluster_name(), "main", "stop"]
        if crash:
            stop += ["-m", "immediate"]
        subprocess.run(stop, check=True, capture_output=True)
    else:
        s.proxies.postgres.cut()
    down_at = time.monotonic()  # stopping a real server takes a while: from here it is down
    time.sleep(outage_s)
    up_at = time.monotonic()
    if real_service:
        subprocess.run(
            ["pg_ctlcluster", "--skip-systemctl-redirect", _pg_cluster_name(), "main", "start"],
            check=True,
            capture_output=True,
        )
        from django.db import connection

        connection.close()  # the test process's own connection died with the server
    else:
        s.proxies.postgres.restore()
    restored_wall, restored = timezone.now(), time.monotonic()
    recovery_s = _recovery(s.tenant, restored_wall, restored, timeout_s=30)
    load.join(120)
    report = ledger(
        f"PostgreSQL {'crashed' if crash else 'stopped' if real_service else 'cut'} {outage_s:g} s",
        s.tenant,
        s.clients.submissions,
        bound_s=90,
        started_at=restored,
    )
    # Sent well inside the outage (a request sent just before the restore may be served).
    during = [x for x in s.clients.submissions if down_at + 0.5 <= x.at <= up_at - 0.5]
    report.extra.update(
        during_outage={
            code: sum(1 for x in during if x.status == code)
            for code in sorted({x.status for x in during})
        },
        recovery_s=f"{recovery_s:.2f}" if recovery_s is not None else "NONE",
        worker_requeued=watch.count(REQUEUED),
    )
    report_and_check(report)
    assert recovery_s is not None and recovery_s < 20, report.line()
    assert report.extra["worker_requeued"] > 0, "the fault never reached the worker"
    assert report.final_after_s < SETTLED_WITHIN_S, report.line()
    # While the database is away the API says so: 503 with Retry-After.
    assert during and all(x.status == 503 for x in during), report.line()


@pytest.mark.chaos
def test_postgres_cut(scenario):
    postgres_outage(scenario, outage_s=3)


@full[0]
@full[1]
def test_postgres_cut_full(scenario):
    postgres_outage(scenario, outage_s=8)


@real[0]
@real[1]
def test_postgres_restarted_real(scenario):
    postgres_outage(scenario, outage_s=8, real_service=True)


@real[0]
@real[1]
def test_postgres_crashed_real(scenario):
    postgres_outage(scenario, outage_s=3, real_service=True, crash=True)


def postgres_flapping(s, cuts: int, rate: float) -> None:
    """Many short cuts under a fast load: some land between a submission's COMMIT and its
    answer or its publish. A job committed then is answered 202 and sent at once, or answered
    503 (a phantom) and sent all the same: none waits for the lost-message sweep."""
    busy_backlog(s, 40)
    load = s.clients.run_in_background(
        [noop_job(f"flap {i}", sleep_ms=5) for i in range(int(rate * (cuts * 0.75 + 2)))],
        rate_per_s=rate,
    )
    time.sleep(1)
    for _ in range(cuts):
        s.proxies.postgres.cut()
        time.sleep(0.25)
        s.proxies.postgres.restore()
        time.sleep(0.5)
    restored = time.monotonic()
    load.join(120)
    report = ledger(
        f"PostgreSQL cut {cuts} times",
        s.tenant,
        s.clients.submissions,
        bound_s=90,
        started_at=restored,
    )
    report_and_check(report)
    assert report.final_after_s < SETTLED_WITHIN_S, report.line()
    assert report.completed == report.accepted + report.phantom, report.line()


@pytest.mark.chaos
def test_postgres_flapping(scenario):
    postgres_flapping(scenario, cuts=8, rate=40.0)


@full[0]
@full[1]
def test_postgres_flapping_full(scenario):
    postgres_flapping(scenario, cuts=24, rate=60.0)


# --- 4. PostgreSQL out of connections while jobs are claimed --------------------------------


def postgres_exhausted(s, outage_s: float, backlog: int) -> None:
    # A backlog the worker is claiming batch after batch when the slots run out.
    busy_backlog(s, backlog)
    rate = 10.0
    load = s.clients.run_in_background(
        [noop_job(f"slots {i}", sleep_ms=20) for i in range(int(rate * (outage_s + 3)))],
        rate_per_s=rate,
    )
    time.sleep(1)
    watch = LogWatch(s)
    # Every process must open a new connection, and PostgreSQL has no slot for it.
    s.proxies.postgres.refuse_new(postgres_too_many_clients)
    dropped = s.proxies.postgres.cut_existing()
    time.sleep(outage_s)
    refused = s.proxies.postgres.refused
    s.proxies.postgres.restore()
    restored_wall, restored = timezone.now(), time.monotonic()
    recovery_s = _recovery(s.tenant, restored_wall, restored, timeout_s=30)
    load.join(120)
    report = ledger(
        f"PostgreSQL out of connections {outage_s:g} s",
        s.tenant,
        s.clients.submissions,
        bound_s=120,
        started_at=restored,
    )
    report.extra.update(
        connections_dropped=dropped,
        connections_refused=refused,
        recovery_s=f"{recovery_s:.2f}" if recovery_s is not None else "NONE",
        worker_requeued=watch.count(REQUEUED),
    )
    report_and_check(report)
    assert report.extra["worker_requeued"] > 0, "the fault never reached the worker"
    assert report.final_after_s < SETTLED_WITHIN_S, report.line()
    # A phantom (answered 503, yet committed: the fault struck after COMMIT) runs too.
    assert report.completed == report.accepted + report.phantom, report.line()


@pytest.mark.chaos
def test_postgres_connections_exhausted(scenario):
    postgres_exhausted(scenario, outage_s=3, backlog=80)


@full[0]
@full[1]
def test_postgres_connections_exhausted_full(scenario):
    postgres_exhausted(scenario, outage_s=8, backlog=200)


# --- 5. Redis away under load: bulk jobs still complete -----------------------------------


def bulk_job(i: int, texts: int) -> tuple[str, dict]:
    return (
        "/api/v1/jobs/bulk",
        {
            "service": "noop",
            "priority": "batch",
            "input": {"texts": [f"b{i}-{t}" for t in range(texts)]},
        },
    )


def redis_outage(s, outage_s: float, bulks: int, *, real_service: bool = False) -> None:
    # Slow single jobs first, so the bulk pieces behind them finish while Redis is away (the
    # fair share, rate limits and stats live there): every bulk must still be assembled.
    busy_backlog(s, 32, sleep_ms=100)
    s.clients.run([bulk_job(i, 40) for i in range(bulks)])
    rate = 6.0
    mixed = [
        bulk_job(1000 + i, 16) if i % 3 == 0 else noop_job(f"redis {i}", sleep_ms=5)
        for i in range(int(rate * (outage_s + 4)))
    ]
    load = s.clients.run_in_background(mixed, rate_per_s=rate)
    time.sleep(0.5)
    watch = LogWatch(s)
    if real_service:
        subprocess.run(["redis-cli", "shutdown", "nosave"], capture_output=True)
    else:
        s.proxies.redis.cut()
    time.sleep(outage_s)
    if real_service:
        subprocess.run(
            [
                "redis-server",
                "--daemonize",
                "yes",
                "--bind",
                "127.0.0.1",
                "-::1",
                "--port",
                "6379",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                "/var/lib/redis",
                "--logfile",
                "/var/log/redis/ci.log",
            ],
            check=True,
            capture_output=True,
        )
        wait_for(
            lambda: subprocess.run(["redis-cli", "ping"], capture_output=True).returncode == 0, 10
        )
    else:
        s.proxies.redis.restore()
    restored = time.monotonic()
    load.join(120)
    report = ledger(
        f"Redis {'restarted' if real_service else 'cut'} {outage_s:g} s (bulk)",
        s.tenant,
        s.clients.submissions,
        bound_s=120,
        started_at=restored,
    )
    parents = Job.objects.filter(tenant=s.tenant, is_bulk=True)
    report.extra.update(
        result_backend_errors=watch.count("Pool callback raised exception")
        + watch.count("Task handler raised error"),
        worker_requeued=watch.count(REQUEUED),
        bulks=parents.count(),
        bulks_succeeded=parents.filter(status=JobStatus.SUCCEEDED).count(),
        pieces=Job.objects.filter(tenant=s.tenant, parent__isnull=False).count(),
    )
    report_and_check(report)
    assert report.extra["bulks"] >= bulks
    assert report.extra["bulks_succeeded"] == report.extra["bulks"], report.line()


@pytest.mark.chaos
def test_redis_cut_bulk_jobs_complete(scenario):
    redis_outage(scenario, outage_s=3, bulks=4)


@full[0]
@full[1]
def test_redis_cut_bulk_jobs_complete_full(scenario):
    redis_outage(scenario, outage_s=10, bulks=10)


@real[0]
@real[1]
def test_redis_restarted_real(scenario):
    redis_outage(scenario, outage_s=5, bulks=10, real_service=True)


# --- 6. a job routed to a cloud backend while the I/O workers are down -----------------------


@pytest.mark.chaos
def test_cloud_routed_jobs_rescued_when_io_workers_die(
    scenario, make_service, make_backend, make_route, upstream
):
    """Jobs on their way to a cloud API — 8 mid-call on the I/O worker's threads, the rest in
    the io queue — when the only I/O worker is killed: the sweep (stranded after 3 s) records
    the cloud attempt as failed and hands every one to the local GPU worker; none waits for an
    I/O worker that never comes back."""
    from routing.models import AttemptOutcome, Backend, JobAttempt

    s = scenario
    service = make_service("embedding", queue_timeout=900, total_timeout=900)
    # Disabled while the jobs are routed, or the router (local first) would never pick the
    # cloud with a GPU worker up; enabled before the I/O worker dies.
    local = make_backend("local", kind="local", timeout_s=8.0, enabled=False)
    # A claim younger than the longest backend timeout may still be live: 8 s.
    free = make_backend("free", timeout_s=8.0)
    make_route(service, (free, 0), (local, 1))
    # The cloud API hangs: the I/O worker's threads are all mid-call when it dies.
    upstream.script("free", mode="hang", hang_s=60)
    s.cluster.io_worker(wait=False)
    s.cluster.gpu_worker("gpu-embedding", services=("embedding",), wait=False)
    try:
        s.cluster.wait_ready("io")
        s.cluster.wait_ready("gpu-embedding")
        body = {"service": "embedding", "priority": "batch"}
        accepted = s.clients.run(
            [("/api/v1/jobs", {**body, "input": {"texts": [f"cloud {i}"]}}) for i in range(12)]
        )
        jobs = Job.objects.filter(tenant=s.tenant, service=service)
        assert all(j.route.backend == free for j in jobs.select_related("route__backend"))
        assert wait_for(lambda: jobs.filter(status=JobStatus.RUNNING).count() >= 8, 20)
        Backend.objects.filter(pk=local.pk).update(enabled=True)
        s.cluster.kill("io")
        killed = time.monotonic()
        report = ledger(
            "cloud-routed jobs, I/O worker killed",
            s.tenant,
            accepted,
            bound_s=60,
            started_at=killed,
        )
    finally:
        s.cluster.stop("gpu-embedding")
        s.cluster.stop("io")
        upstream.reset()
    paths = {
        tuple(
            (a.backend.name, a.outcome)
            for a in JobAttempt.objects.filter(job=j).select_related("backend").order_by("id")
        )
        for j in jobs
    }
    report.extra.update(paths=sorted(paths))
    report_and_check(report)
    assert report.completed == 12, report.line()
    assert paths == {(("free", AttemptOutcome.FAILED), ("local", AttemptOutcome.SUCCEEDED))}


# --- 7. a poison job among 200 good ones ----------------------------------------------------


@pytest.mark.chaos
def test_poison_job_among_200_good_ones(scenario):
    from inference.dispatch.broker import ready_message_counts
    from inference.dispatch.queues import dead_letter_queue

    s = scenario
    before = ready_message_counts([dead_letter_queue()])[dead_letter_queue()]
    good = [noop_job(f"good {i}", sleep_ms=2) for i in range(200)]
    bodies = good[:100] + [noop_job(POISON_TEXT)] + good[100:]
    s.clients.threads = 1  # in order, so the poison job sits in the middle of the stream
    submissions = s.clients.run(bodies)
    poison_id = submissions[100].job_id
    report = ledger("poison among 200", s.tenant, submissions, bound_s=90)
    report_and_check(report)
    assert report.completed == 200 and report.failed == 1, report.line()
    poison = Job.objects.get(pk=poison_id)
    assert poison.status == JobStatus.FAILED and poison.dead_lettered_at is not None
    assert "poison" in poison.error
    assert wait_for(
        lambda: ready_message_counts([dead_letter_queue()])[dead_letter_queue()] == before + 1, 10
    )
