"""What is waiting where: per service and tier, the queue depth, the oldest wait, the throughput
over the last minute, and the batch cost model with its preemption budget. Served by
`GET /api/v1/queues` (and `renq queues`)."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Min, Q, Value
from django.db.models.functions import Coalesce, NullIf
from django.utils import timezone

from inference.jobs.tiers import TIER_ORDER
from inference.models import Job, JobStatus, Service
from inference.scheduling.cost_model import (
    PASS_TARGET_FRACTION,
    BatchCostModel,
    preemption_budget_s,
)

THROUGHPUT_WINDOW = timedelta(minutes=1)


def queue_report(now=None) -> list[dict]:
    now = now or timezone.now()
    # The tier queue a job waits in: its own, or the one aging promoted it to.
    waiting_in = Coalesce(NullIf("serving_tier", Value("")), "tier")
    queued = {
        (row["service_id"], row["waiting_tier"]): row
        for row in Job.objects.filter(status=JobStatus.QUEUED, parent__isnull=True)
        .annotate(waiting_tier=waiting_in)
        .values("service_id", "waiting_tier")
        .annotate(depth=Count("id"), oldest=Min("created_at"))
    }
    finished = {
        (row["service_id"], row["tier"]): row["n"]
        for row in Job.objects.filter(finished_at__gte=now - THROUGHPUT_WINDOW, parent__isnull=True)
        .values("service_id", "tier")
        .annotate(n=Count("id", filter=Q(status=JobStatus.SUCCEEDED)))
    }
    report = []
    for service in Service.objects.filter(active=True).order_by("name"):
        budget_s = preemption_budget_s(service)
        tiers = {}
        for tier in TIER_ORDER:
            row = queued.get((service.pk, tier.value))
            oldest = row["oldest"] if row else None
            tiers[tier.value] = {
                "depth": row["depth"] if row else 0,
                "oldest_wait_s": round((now - oldest).total_seconds(), 3) if oldest else None,
                "completed_last_minute": finished.get((service.pk, tier.value), 0),
            }
        report.append(
            {
                "service": service.name,
                "kind": service.kind,
                "tiers": tiers,
                "preemption_budget_s": budget_s,
                # What the batch former aims a non-realtime pass at (the rest is dispatch).
                "pass_target_s": round(budget_s * PASS_TARGET_FRACTION, 6),
                # One model per kind of device the service's workers run on.
                "cost_model": {
                    device: {
                        "per_token_s": cost.per_token_s,
                        "per_batch_s": cost.per_batch_s,
                        "samples": cost.samples,
                        "tokens_within_budget": cost.tokens_within(budget_s),
                    }
                    for device, cost in BatchCostModel.measured(service.name).items()
                },
            }
        )
    return report
