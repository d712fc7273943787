"""Queue depth, one definition for admission (inference.intake.admission, whose SQL counts the
same rows under its lock, each tenant's as far as they count: migration 0017), `GET
/api/v1/queues` (inference.dispatch.queue_report) and `renq_queue_depth`
(inference.metrics.collector) (Issue #27).

A service's depth in a tier is its queued jobs that wait in that tier's queue: their own tier,
or the one aging promoted them to. Bulk pieces count, as the jobs of their tier they are; a
bulk parent never does (it runs while its pieces wait). Jobs routed to a cloud backend count
too: they are the service's work, waiting.
"""

from __future__ import annotations

from datetime import datetime

from django.db.models import Count, Min, QuerySet, Value
from django.db.models.functions import Coalesce, NullIf

from inference.models import Job, JobStatus, Service

# The tier queue a job waits in: its own, or the one aging promoted it to.
WAITING_TIER = Coalesce(NullIf("serving_tier", Value("")), "tier")


def queued_jobs() -> QuerySet:
    """Every job the depth counts."""
    return Job.objects.filter(status=JobStatus.QUEUED)


def queue_depths() -> dict[tuple[int, str], tuple[int, datetime]]:
    """(service id, tier) → (depth, the oldest queued job's created_at), for the tier queues
    that hold any: one GROUP BY."""
    return {
        (row["service_id"], row["waiting_tier"]): (row["depth"], row["oldest"])
        for row in queued_jobs()
        .annotate(waiting_tier=WAITING_TIER)
        .values("service_id", "waiting_tier")
        .annotate(depth=Count("id"), oldest=Min("created_at"))
        .order_by()
    }


def service_depth(service: Service) -> int:
    """The service's depth over all its tiers."""
    return queued_jobs().filter(service=service).count()


def tenant_depths(service: Service) -> dict[int, int]:
    """Tenant id → its queued jobs in the service (over all tiers), as admission weighs them."""
    return dict(
        queued_jobs()
        .filter(service=service)
        .values("tenant_id")
        .annotate(n=Count("id"))
        .order_by()
        .values_list("tenant_id", "n")
    )
