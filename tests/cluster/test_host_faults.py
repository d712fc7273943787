"""Faults across hosts: renq on five hosts, each a Linux network namespace the module makes
and removes (tests/cluster/network.py), under load over real HTTP.

Topology:

    root namespace   PostgreSQL :5432, RabbitMQ :5672, Redis :6379 (the machine's own, on
                     127.0.0.1); per host, one fault proxy per service listening on the root
                     end of the host's veth (10.213.N.1); the test and its HTTP clients
        | veth pair: 10.213.N.1 (root) <-> 10.213.N.2 (host); nothing routed further
    gpu1, gpu2       a GPU worker each (noop + embedding, the real all-MiniLM-L6-v2)
    io               the I/O worker (io queues, 8 threads)
    web              gunicorn on 10.213.N.2:8000, which the clients reach over the veth
    ctl              the control worker (beat, sweeps every 2 s)

A host is cut from one service by its proxy, partitioned by taking its veth down (its TCP
connections hang, no reset), hung by SIGSTOP to every process in its namespace, killed by
SIGKILL to them all. Each scenario prints one line (also appended to .run/cluster-report.txt):
accepted, succeeded, lost and duplicated (both must be 0), the recovery time (fault -> last
job the faulted host held final) and the realtime latency of jobs sent during the fault.

`make test` runs the reduced forms (marker `cluster`); `make cluster` the full forms
(`cluster_full`, RENQ_CLUSTER_FULL=1).
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from inference.models import TERMINAL_STATUSES, Job, JobStatus
from tests.chaos.cluster import Submission, ledger, noop_job, wait_all_final, wait_for
from tests.cluster.conftest import CLUSTER_FULL, GPU_HOSTS
from tests.cluster.network import NETNS_PREFIX
from tests.renq_site.helpers import RUN_DIR

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]

full = [
    pytest.mark.cluster_full,
    pytest.mark.skipif(
        not CLUSTER_FULL, reason="full-size form: RENQ_CLUSTER_FULL=1 (make cluster)"
    ),
]

REPORT_PATH = RUN_DIR / "cluster-report.txt"
# The target: the jobs a hung or partitioned host held are final on a peer this soon
# after the fault.
TAKEOVER_BOUND_S = 30.0
# A worker host's fault lasts until its held jobs are final, or this long: past the target,
# so a recovery that needed the host back is measured as late instead of hidden by its return.
FAULT_AT_MOST_S = TAKEOVER_BOUND_S + 10
REALTIME_PER_S = 2.0


def realtime_job(text: str) -> tuple[str, dict]:
    return (
        "/api/v1/jobs",
        {"service": "embedding", "priority": "realtime", "input": {"texts": [text]}},
    )


def host_of(worker: str) -> str:
    """The host a job's `worker` (hostname:pid) ran on; hostnames are the namespaces'."""
    return worker.split(":", 1)[0].removeprefix(NETNS_PREFIX)


def held_by(tenant, host: str) -> list[str]:
    running = Job.objects.filter(tenant=tenant, status=JobStatus.RUNNING, is_bulk=False)
    return [
        str(pk) for pk, worker in running.values_list("pk", "worker") if host_of(worker) == host
    ]


def final_after(job_ids: list[str], moment: datetime) -> float | None:
    """Seconds from `moment` until the last of the jobs was final (None: one is not yet)."""
    jobs = Job.objects.filter(pk__in=job_ids)
    if not job_ids or jobs.exclude(status__in=TERMINAL_STATUSES).exists():
        return None if job_ids else 0.0
    last = max(j.finished_at for j in jobs)
    return max(0.0, (last - moment).total_seconds())


def realtime_figures(sent: list[Submission]) -> dict:
    """What became of the realtime jobs sent during a fault: served, by which host, and
    their latency (created -> finished)."""
    ids = [s.job_id for s in sent if s.job_id]
    jobs = list(Job.objects.filter(pk__in=ids, service__name="embedding"))
    served = [j for j in jobs if j.status == JobStatus.SUCCEEDED]
    latencies = sorted((j.finished_at - j.created_at).total_seconds() for j in served)
    return {
        "accepted": len(jobs),
        "served": len(served),
        "by_host": dict(Counter(host_of(j.worker) for j in served)),
        "p50_s": round(statistics.median(latencies), 2) if latencies else None,
        "max_s": round(latencies[-1], 2) if latencies else None,
    }


def report_and_check(report) -> None:
    report.suite = "cluster"
    line = report.line()
    print("\n" + line)
    REPORT_PATH.parent.mkdir(exist_ok=True)
    with open(REPORT_PATH, "a") as out:  # `make cluster` prints the file at the end
        out.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}\n")
    report.assert_ok()


def _during(submissions: list[Submission], start: float, end: float) -> list[Submission]:
    return [x for x in submissions if start <= x.at <= end]


# --- a GPU-worker host partitioned, hung or killed ------------------------------------------


def worker_host_fault(s, fault: str, *, backlog: int, realtime: int) -> tuple:
    """`fault` ("partition", "hang", "kill") on gpu1 while both GPU hosts work through a batch
    backlog and realtime jobs keep coming. Returns (report, realtime figures, held final)."""
    cluster = s.cluster
    victim, peer = GPU_HOSTS
    s.clients.run(
        [noop_job(f"{fault} {i}", sleep_ms=150, priority="batch") for i in range(backlog)]
    )
    held: list[str] = []

    def victim_holds_jobs() -> bool:
        held[:] = held_by(s.tenant, victim)
        return bool(held)

    assert wait_for(victim_holds_jobs, 30, poll_s=0.02), "gpu1 claimed nothing"
    fault_wall, fault_at = timezone.now(), time.monotonic()
    if fault == "partition":
        cluster.partition(victim)
    elif fault == "hang":
        cluster.hang(victim)
    else:
        cluster.kill(victim)
    # What it held when the fault struck: claimed before, or still its own after (a frozen
    # or cut-off host changes nothing), and not final before the fault.
    at_fault = Job.objects.filter(pk__in={*held, *held_by(s.tenant, victim)}).exclude(
        finished_at__lt=fault_wall
    )
    held = [str(pk) for pk in at_fault.values_list("pk", flat=True)]
    assert held, "gpu1 held no job when the fault struck"
    sending_s = realtime / REALTIME_PER_S
    load = s.clients.run_in_background(
        [realtime_job(f"{fault} rt {i}") for i in range(realtime)],
        rate_per_s=REALTIME_PER_S,
        deadline_s=sending_s + 60,
    )
    # The fault holds until the held jobs are final elsewhere (or the bound passes), and at
    # least while the realtime jobs are sent.
    wait_all_final(held, FAULT_AT_MOST_S - (time.monotonic() - fault_at))
    held_final_s = final_after(held, fault_wall)
    time.sleep(max(0.0, fault_at + sending_s - time.monotonic()))
    lifted_at = time.monotonic()
    if fault == "partition":
        cluster.heal(victim)
    elif fault == "hang":
        cluster.wake(victim)
    load.join(sending_s + 90)
    report = ledger(
        f"{fault} GPU host gpu1, backlog={backlog} realtime={realtime}",
        s.tenant,
        s.clients.submissions,
        bound_s=120,
        started_at=fault_at,
    )
    if held_final_s is None:  # only once the host was back
        held_final_s = final_after(held, fault_wall)
    sent = _during(s.clients.submissions, fault_at, lifted_at)
    during = realtime_figures(sent)
    report.extra.update(
        held_at_fault=len(held),
        recovery_s=f"{held_final_s:.1f}" if held_final_s is not None else "NONE",
        fault_lasted_s=f"{lifted_at - fault_at:.1f}",
        realtime_during_fault=during,
    )
    report_and_check(report)
    assert report.completed == report.accepted, report.line()
    assert sent and all(x.status == 202 for x in sent), report.line()
    assert during["served"] == during["accepted"] == len(sent), report.line()
    assert set(during["by_host"]) <= {peer}, report.line()
    return report, during, held_final_s


@pytest.mark.cluster
def test_hung_gpu_host_work_taken_over(scenario):
    """gpu1 frozen (SIGSTOP, its connections open): the jobs it held are final on gpu2 within
    30 s of the hang, while it is still frozen; the realtime jobs sent meanwhile are all
    served by gpu2; once woken, nothing it held is stored twice."""
    _, _, held_final_s = worker_host_fault(scenario, "hang", backlog=40, realtime=10)
    assert held_final_s is not None and held_final_s <= TAKEOVER_BOUND_S


@pytest.mark.cluster
def test_killed_gpu_host_work_taken_over(scenario):
    """gpu1's processes all SIGKILLed: its connections close, gpu2 takes its jobs over."""
    _, _, held_final_s = worker_host_fault(scenario, "kill", backlog=32, realtime=8)
    assert held_final_s is not None and held_final_s <= TAKEOVER_BOUND_S


@full[0]
@full[1]
def test_partitioned_gpu_host_work_taken_over_full(scenario):
    """gpu1's link down (its TCP connections hang, nothing resets them) and healed later."""
    _, _, held_final_s = worker_host_fault(scenario, "partition", backlog=200, realtime=40)
    assert held_final_s is not None and held_final_s <= TAKEOVER_BOUND_S


@full[0]
@full[1]
def test_hung_gpu_host_work_taken_over_full(scenario):
    _, _, held_final_s = worker_host_fault(scenario, "hang", backlog=200, realtime=40)
    assert held_final_s is not None and held_final_s <= TAKEOVER_BOUND_S


@full[0]
@full[1]
def test_killed_gpu_host_work_taken_over_full(scenario):
    _, _, held_final_s = worker_host_fault(scenario, "kill", backlog=200, realtime=40)
    assert held_final_s is not None and held_final_s <= TAKEOVER_BOUND_S


# --- the web host cut from Redis -----------------------------------------------------------


def mixed_load(tag: str, n: int) -> list[tuple[str, dict]]:
    """Every third a realtime embedding job, the rest short noop jobs."""
    return [
        realtime_job(f"{tag} {i}") if i % 3 == 0 else noop_job(f"{tag} {i}", sleep_ms=20)
        for i in range(n)
    ]


def web_cut_from_redis(s, outage_s: float, rate: float) -> None:
    web = s.cluster.hosts["web"]
    before_s, after_s = 1.0, 3.0
    load = s.clients.run_in_background(
        mixed_load("redis", int(rate * (before_s + outage_s + after_s))), rate_per_s=rate
    )
    time.sleep(before_s)
    fault_wall, fault_at = timezone.now(), time.monotonic()
    web.redis.cut()
    time.sleep(outage_s)
    web.redis.restore()
    lifted_at = time.monotonic()
    load.join(120)
    report = ledger(
        f"web host cut from Redis {outage_s:g} s",
        s.tenant,
        s.clients.submissions,
        bound_s=90,
        started_at=fault_at,
    )
    during = _during(s.clients.submissions, fault_at, lifted_at)
    recovery_s = final_after([x.job_id for x in during if x.job_id], fault_wall)
    report.extra.update(
        during_fault=dict(Counter(x.status for x in during)),
        recovery_s=f"{recovery_s:.1f}" if recovery_s is not None else "NONE",
        realtime_during_fault=realtime_figures(during),
    )
    report_and_check(report)
    # Redis holds counters only: submissions are accepted and run without it.
    assert during and all(x.status == 202 for x in during), report.line()
    assert report.completed == report.accepted, report.line()


@full[0]
@full[1]
def test_web_host_cut_from_redis_full(scenario):
    web_cut_from_redis(scenario, outage_s=10, rate=10)


# --- the broker's queues lost under load ---------------------------------------------------


def renq_queue_names() -> list[str]:
    from inference.dispatch.queues import control_queue, io_queues, service_queues

    return [*service_queues("noop"), *service_queues("embedding"), *io_queues(), control_queue()]


def delete_renq_queues() -> int:
    """Every queue of the cluster's prefix deleted with its messages, as a RabbitMQ node that
    comes back without its data; the messages that were waiting in them."""
    from inference.dispatch.broker import ready_message_counts
    from renq_site.celery import app

    names = renq_queue_names()
    waiting = sum(ready_message_counts(names).values())
    with app.connection_for_write() as conn:
        channel = conn.channel()
        for name in names:
            channel.queue_delete(name)
    return waiting


def served_after(tenant, moment: datetime) -> dict[str, int]:
    """Jobs each host finished after `moment`."""
    finished = Job.objects.filter(tenant=tenant, status=JobStatus.SUCCEEDED, finished_at__gt=moment)
    return dict(Counter(host_of(w) for w in finished.values_list("worker", flat=True)))


def queues_lost(s, backlog: int, rate: float, after_s: float) -> None:
    s.clients.run([noop_job(f"lost {i}", sleep_ms=100, priority="batch") for i in range(backlog)])
    load = s.clients.run_in_background(
        mixed_load("lost", int(rate * (1 + after_s))), rate_per_s=rate
    )
    time.sleep(1)
    fault_wall, fault_at = timezone.now(), time.monotonic()
    messages_lost = delete_renq_queues()
    load.join(after_s + 120)
    report = ledger(
        f"broker queues deleted under load, backlog={backlog}",
        s.tenant,
        s.clients.submissions,
        bound_s=120,
        started_at=fault_at,
    )
    # Jobs whose message may have gone: waiting at the fault, or published after it (to a
    # queue that was not there until someone declared it again).
    exposed = Job.objects.filter(tenant=s.tenant, finished_at__gt=fault_wall)
    waits = [(j.finished_at - max(j.created_at, fault_wall)).total_seconds() for j in exposed]
    longest_wait_s = max(waits, default=0.0)
    report.extra.update(
        messages_lost=messages_lost,
        longest_wait_after_fault_s=f"{longest_wait_s:.1f}",
        # From a moment on: a batch finished as the queues went proves nothing.
        served_after_fault=served_after(s.tenant, fault_wall + timedelta(seconds=5)),
        realtime_after_fault=realtime_figures(
            _during(s.clients.submissions, fault_at, time.monotonic())
        ),
    )
    report_and_check(report)
    assert report.completed == report.accepted, report.line()
    # A lost message is found by the sweep (RENQ_LOST_MESSAGE_AFTER_S) and published again,
    # its queue busy or not: no job waits past the bound for it.
    assert longest_wait_s <= TAKEOVER_BOUND_S, report.line()
    # Both GPU hosts serve again after their consumers were cancelled with the queues.
    assert set(report.extra["served_after_fault"]) >= set(GPU_HOSTS), report.line()


@full[0]
@full[1]
def test_broker_queues_lost_under_load_full(scenario):
    queues_lost(scenario, backlog=200, rate=8, after_s=15)
