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

Local processes (`--apply`): one `celery worker --concurrency 1` per process, named
`<service>-<n>@%h`, detached, with its pidfile and log under .run/workers/; stopping sends
SIGTERM (Celery's warm shutdown: the running batch finishes).
"""

from __future__ import annotations

import itertools
import math
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from django.conf import settings
from django.db.models import Count

from inference.dispatch.placement import tier_target_s
from inference.dispatch.queues import service_queues
from inference.jobs.tiers import TIER_ORDER
from inference.models import Job, JobStatus, Service
from routing.capacity import local_throughput


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


# --- local worker processes ---------------------------------------------------------------------


def workers_dir() -> Path:
    return Path(settings.BASE_DIR) / ".run" / "workers"


def _alive(pid: int) -> bool:
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
    subprocess.run(
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
            "--detach",
            f"--pidfile={base}.pid",
            f"--logfile={base}.log",
            "-l",
            "info",
        ],  # fmt: skip
        cwd=settings.BASE_DIR,
        check=True,
    )


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
