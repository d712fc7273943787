"""Admission control: refuse work early (per-tenant rate limit, bounded queue) with a status
and Retry-After, instead of accepting it and letting it rot in a queue."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from inference.models import Job, JobStatus, Service, Tenant
from renq_site.shared_redis import shared_redis


@dataclass
class AdmissionRefused(Exception):
    status_code: int
    field: str
    message: str
    retry_after_s: int

    def __str__(self) -> str:
        return self.message


def check_rate_limit(tenant: Tenant, service: Service, cost: int = 1) -> None:
    """`rate_limit` jobs per second per tenant and service, counted in Redis so every web
    process shares one counter (a per-process counter lets limit × processes through)."""
    if not service.rate_limit:
        return
    second = int(time.time())
    key = f"renq:admit:{service.name}:{tenant.pk}:{second}"
    pipe = shared_redis().pipeline()
    pipe.incrby(key, cost)
    pipe.expire(key, 2)
    count, _ = pipe.execute()
    if count > service.rate_limit:
        raise AdmissionRefused(
            429,
            "service",
            f"rate limit of {service.rate_limit} jobs/s for service '{service.name}' exceeded.",
            retry_after_s=1,
        )


def check_queue_capacity(service: Service) -> None:
    """Bounded queue: past max_queue_size, refuse at once with 503 (never block the client)."""
    if not service.max_queue_size:
        return
    # Counting stops at the limit: the check costs the same with 10 or 10^6 jobs queued.
    depth = (
        Job.objects.filter(service=service, status=JobStatus.QUEUED)
        .values("pk")[: service.max_queue_size]
        .count()
    )
    if depth >= service.max_queue_size:
        # Rough drain time: one batch per batch_timeout is the floor of what a worker does.
        retry = max(1, math.ceil(depth / max(service.batch_size, 1) * service.batch_timeout))
        raise AdmissionRefused(
            503,
            "service",
            f"service '{service.name}' has {depth} queued jobs (max_queue_size "
            f"{service.max_queue_size}); retry later.",
            retry_after_s=retry,
        )
