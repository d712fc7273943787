"""How many GPU worker processes each service needs now, and starting/stopping them locally.

In the spirit of KEDA's RabbitMQ scaler in `ExpectedQueueConsumptionTime` mode: a service needs
enough workers that, for every tier, the jobs a new job of that tier waits behind (queued in it
or a higher tier, plus those running) drain within the tier's target wait at the measured
throughput of one worker (routing.capacity: an EWMA of real batches, or a prior from
batch_size/batch_timeout before any). The targets are the router's spill-over targets
(`inference.dispatch.placement.tier_target_s`: `tiers.<tier>.target_wait_s` of config.yaml;
realtime/api never longer than the service's min(queue_timeout, total_timeout)).
The recommendation stays within [minimum, service.worker_count] (worker_count = the GPUs, or
processes, the service may use) and is 0 only when nothing waits and the minimum is 0.

The same decision is a Prometheus gauge (`ScalingCollector`: renq_autoscale_desired_workers and
the inputs it used), so that KEDA scales a worker Deployment on it (docker/keda-scaledobject.yaml).

Local processes (`--apply`): one `celery worker --concurrency 1` per process, named
`<service>-<n>@%h`, in a session of its own, with its pidfile and log under
.run/workers/<hostname>/ (hosts sharing a checkout each count only their own); stopping sends
SIGTERM (Celery's warm shutdown: the running batch finishes).
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db.models import Count
from prometheus_client.core import GaugeMetricFamily

from inference.dispatch.placement import tier_target_s
from inference.dispatch.queues import service_queues
from inference.jobs.tiers import TIER_ORDER
from inference.models import Job, JobStatus, Service
from routing.capacity import local_throughput

logger = logging.getLogger(__name__)


@dataclass
class ServiceScale:
    service: str
    queued: dict[str, int]
    running: int
    per_worker_jobs_s: float
    measured: bool
    needed: int
    recommended: int
    ceiling: int
    # tier → seconds the backlog ahead of it would take with the recommended workers.
    drain_s: dict[str, float] = field(default_factory=dict)


def recommend(service: Service, *, minimum: int = 1) -> ServiceScale:
    counts = dict(
        Job.objects.filter(service=service, status=JobStatus.QUEUED, is_bulk=False)
        .values_list("tier")
        .annotate(n=Count("pk"))
        .order_by()
    )
    queued = {tier.value: counts.get(tier.value, 0) for tier in TIER_ORDER}
    running = Job.objects.filter(service=service, status=JobStatus.RUNNING, is_bulk=False).count()
    per_worker, measured = local_throughput(
        service.name,
        batch_size=service.batch_size,
        batch_timeout_s=service.batch_timeout,
        worker_count=1,
    )
    needed = 0
    ahead = running
    for tier in TIER_ORDER:
        ahead += queued[tier.value]
        if queued[tier.value]:
            # Workers so that what is ahead of this tier drains within its target.
            rate_needed = ahead / max(tier_target_s(service, tier.value), 1e-3)
            needed = max(needed, math.ceil(rate_needed / per_worker))
    ceiling = max(service.worker_count, 1)
    busy = ahead > 0
    recommended = min(ceiling, max(needed, minimum, 1 if busy else 0))
    scale = ServiceScale(
        service=service.name,
        queued=queued,
        running=running,
        per_worker_jobs_s=per_worker,
        measured=measured,
        needed=needed,
        recommended=recommended,
        ceiling=ceiling,
    )
    backlog = running
    for tier in TIER_ORDER:
        backlog += queued[tier.value]
        scale.drain_s[tier.value] = backlog / (per_worker * max(recommended, 1))
    return scale


# --- the decision as Prometheus gauges ----------------------------------------------------------


class ScalingCollector:
    """`recommend` per active service at scrape time. The minimum is 0: the floor is the
    deployment's own (KEDA's minReplicaCount, renq_autoscale's --min), so the gauge says only
    what the queues need."""

    def collect(self):
        labels = ["service"]
        desired = GaugeMetricFamily(
            "renq_autoscale_desired_workers",
            "GPU workers the service needs now for every tier's backlog to drain within its "
            "target wait, within [0, worker_count]; KEDA scales the worker Deployment on it.",
            labels=labels,
        )
        needed = GaugeMetricFamily(
            "renq_autoscale_needed_workers",
            "Workers the backlog needs before the worker_count cap (above max_workers: capped).",
            labels=labels,
        )
        ceiling = GaugeMetricFamily(
            "renq_autoscale_max_workers",
            "The service's worker_count: the most workers the autoscaler recommends.",
            labels=labels,
        )
        throughput = GaugeMetricFamily(
            "renq_autoscale_worker_jobs_per_second",
            "Jobs per second one worker of the service serves, as the autoscaler assumed.",
            labels=labels,
        )
        measured = GaugeMetricFamily(
            "renq_autoscale_throughput_measured",
            "1 when that throughput is measured from real batches, 0 while it is the prior "
            "from batch_size/batch_timeout.",
            labels=labels,
        )
        drain = GaugeMetricFamily(
            "renq_autoscale_drain_seconds",
            "Seconds the backlog ahead of a new job of the tier takes with the desired workers.",
            labels=["service", "tier"],
        )
        try:
            for service in Service.objects.filter(active=True):
                scale = recommend(service, minimum=0)
                desired.add_metric([scale.service], scale.recommended)
                needed.add_metric([scale.service], scale.needed)
                ceiling.add_metric([scale.service], scale.ceiling)
                throughput.add_metric([scale.service], scale.per_worker_jobs_s)
                measured.add_metric([scale.service], 1.0 if scale.measured else 0.0)
                for tier, seconds in scale.drain_s.items():
                    drain.add_metric([scale.service, tier], seconds)
        except Exception:
            logger.exception("metrics: could not compute the autoscaler's decision")
        yield from (desired, needed, ceiling, throughput, measured, drain)


# --- local worker processes ---------------------------------------------------------------------


def workers_dir(hostname: str | None = None) -> Path:
    """Where this host's (or `hostname`'s) local workers keep their pidfiles and logs."""
    return Path(settings.BASE_DIR) / ".run" / "workers" / (hostname or socket.gethostname())


# The workers this process started, polled so that one which exits is reaped, not counted.
_started: dict[int, subprocess.Popen] = {}


def _alive(pid: int) -> bool:
    if pid in _started:
        return _started[pid].poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def local_workers(service_name: str) -> dict[int, int]:
    """Running local workers of the service: slot number → pid (stale pidfiles removed)."""
    found = {}
    for pidfile in sorted(workers_dir().glob(f"{service_name}-*.pid")):
        slot = pidfile.stem.rpartition("-")[2]
        try:
            pid = int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
        if slot.isdigit() and _alive(pid):
            found[int(slot)] = pid
        else:
            pidfile.unlink(missing_ok=True)
    return found


def start_worker(service_name: str, slot: int) -> None:
    directory = workers_dir()
    directory.mkdir(parents=True, exist_ok=True)
    base = directory / f"{service_name}-{slot}"
    # Not `--detach`: its pid would be known only once the worker has loaded. Its own session
    # keeps it running when this command ends.
    with open(f"{base}.log", "ab") as log:
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "renq_site",
                "worker",
                "-n",
                f"{service_name}-{slot}@%h",
                "-Q",
                ",".join(service_queues(service_name)),
                "--concurrency",
                "1",
                f"--pidfile={base}.pid",
                "-l",
                "info",
            ],  # fmt: skip
            cwd=settings.BASE_DIR,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _started[worker.pid] = worker
    # Counted from now: Celery writes its pidfile only once loaded, and a pass before that
    # must not start the slot again.
    Path(f"{base}.pid").write_text(f"{worker.pid}\n")


def stop_worker(pid: int) -> None:
    """Warm shutdown: Celery finishes the running batch, then exits."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def apply(scale: ServiceScale) -> tuple[int, int]:
    """Start or stop local workers of the service to match the recommendation; returns
    (started, stopped)."""
    running = local_workers(scale.service)
    free_slots = (n for n in itertools.count() if n not in running)
    started = 0
    for _ in range(scale.recommended - len(running)):
        start_worker(scale.service, next(free_slots))
        started += 1
    surplus = sorted(running, reverse=True)[: max(len(running) - scale.recommended, 0)]
    for slot in surplus:
        stop_worker(running[slot])
    return started, len(surplus)
