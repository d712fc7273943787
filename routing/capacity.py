"""How long a job would wait on the local GPU workers, and how long it may wait.

predicted wait = jobs ahead of it / local throughput

- jobs ahead: queued jobs of the service in the job's tier or a higher one (workers serve
  higher tiers first), not counting jobs routed to cloud backends, plus the jobs running now.
  One indexed COUNT in Postgres, which is the record of truth (RabbitMQ's queue depth misses
  the jobs a worker has pulled into its batch window).
- throughput: a moving average of jobs/s per local worker process, measured from every batch
  the workers run (`record_local_batch`), times the service's `worker_count`. Before any
  measurement, a prior from the service's settings.

Targets: realtime/api jobs expire after `queue_timeout` and promise `total_timeout`, so the
smaller of the two is their target; batch and offline jobs wait for the cheap local GPU unless
the wait is absurd.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.db.models import Q

from inference.models import Job, JobStatus, Service
from inference.tiers import TIER_ORDER, Tier, queue_name
from renq_site.celery import app
from routing.stats import read_ewma, throughput_key, update_ewma

# Longest local wait that batch/offline work accepts before spilling to the cloud.
NON_INTERACTIVE_TARGET_S = {Tier.BATCH: 15 * 60.0, Tier.OFFLINE: 6 * 3600.0}
# Prior of one batch's duration beyond batch_timeout, until a real measurement exists.
PRIOR_BATCH_RUN_S = 0.1
# How long a consumer count read from RabbitMQ is trusted (one round trip per tier queue).
CONSUMER_COUNT_TTL_S = 1.0

logger = logging.getLogger(__name__)
_consumer_counts: dict[str, tuple[float, int]] = {}


@dataclass(frozen=True)
class LocalWait:
    wait_s: float
    jobs_ahead: int
    throughput_jobs_s: float
    target_s: float
    measured: bool

    @property
    def meets_target(self) -> bool:
        return self.wait_s <= self.target_s


def tier_target_s(service: Service, tier: str) -> float:
    tier = Tier(tier)
    if tier.is_interactive:
        return min(service.queue_timeout, service.total_timeout)
    return NON_INTERACTIVE_TARGET_S[tier]


def record_local_batch(service_name: str, jobs: int, seconds: float) -> None:
    """One worker ran `jobs` in `seconds` of inference: update the service's throughput."""
    if jobs > 0 and seconds > 0:
        update_ewma(throughput_key(service_name), jobs / seconds)


def local_throughput(service: Service) -> tuple[float, bool]:
    """(jobs per second over all local workers of the service, whether measured)."""
    per_worker = read_ewma(throughput_key(service.name))
    measured = per_worker is not None
    if per_worker is None:
        per_worker = service.batch_size / (service.batch_timeout + PRIOR_BATCH_RUN_S)
    return per_worker * max(service.worker_count, 1), measured


def jobs_ahead(service: Service, tier: str) -> int:
    served_first = [t.value for t in TIER_ORDER[: Tier(tier).rank + 1]]
    on_cloud = Q(route__backend__kind="openai")
    return (
        Job.objects.filter(service=service)
        .filter(Q(status=JobStatus.QUEUED, tier__in=served_first) | Q(status=JobStatus.RUNNING))
        .exclude(on_cloud)
        .count()
    )


def predict_local_wait(service: Service, tier: str) -> LocalWait:
    ahead = jobs_ahead(service, tier)
    throughput, measured = local_throughput(service)
    return LocalWait(
        wait_s=ahead / throughput,
        jobs_ahead=ahead,
        throughput_jobs_s=throughput,
        target_s=tier_target_s(service, tier),
        measured=measured,
    )


def local_consumer_count(service_name: str) -> int:
    """How many consumers RabbitMQ has on the service's tier queues, i.e. whether any GPU
    worker is there to serve a local job. RabbitMQ drops a consumer the moment its worker's
    connection closes (crash, kill, shutdown), so this sees a stopped worker at once, where a
    heartbeat would need a timeout. Cached for CONSUMER_COUNT_TTL_S per process."""
    now = time.monotonic()
    cached = _consumer_counts.get(service_name)
    if cached and cached[0] > now:
        return cached[1]
    total = 0
    try:
        with app.connection_for_read() as connection:
            for tier in TIER_ORDER:
                channel = connection.channel()
                try:
                    total += channel.queue_declare(
                        queue=queue_name(service_name, tier), passive=True
                    ).consumer_count
                except connection.channel_errors:
                    pass  # never declared: nobody consumes it (the 404 closed the channel)
                finally:
                    try:
                        channel.close()
                    except Exception:  # noqa: BLE001 - a channel the 404 already closed
                        pass
    except Exception:  # noqa: BLE001 - broker unreachable: assume workers, as before
        logger.warning("could not read consumer counts for %s", service_name, exc_info=True)
        return 1
    _consumer_counts[service_name] = (now + CONSUMER_COUNT_TTL_S, total)
    return total
