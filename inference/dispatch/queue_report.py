"""What is waiting where: per service and tier, the queue depth (inference.metrics.queue_depth,
as admission and `renq_queue_depth` count it), the oldest wait, the throughput over the last
minute, and the batch cost model with its preemption budget. Served by `GET /api/v1/queues`
(and `renq queues`)."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Count, Q
from django.utils import timezone

from inference.jobs.tiers import TIER_ORDER
from inference.metrics.queue_depth import queue_depths
from inference.models import Job, JobStatus, Service
from inference.scheduling.cost_model import (
    PASS_TARGET_FRACTION,
    BatchCostModel,
    preemption_budget_s,
)

THROUGHPUT_WINDOW = timedelta(minutes=1)


def queue_report(now=None) -> list[dict]:
    now = now or timezone.now()
    queued = queue_depths()
    # Bulk pieces are jobs of their tier; their parents, the bulk requests, are not counted.
    finished = {
        (row["service_id"], row["tier"]): row["n"]
        for row in Job.objects.filter(finished_at__gte=now - THROUGHPUT_WINDOW, is_bulk=False)
        .values("service_id", "tier")
        .annotate(n=Count("id", filter=Q(status=JobStatus.SUCCEEDED)))
    }
    report = []
    for service in Service.objects.filter(active=True).order_by("name"):
        budget_s = preemption_budget_s(service)
        tiers = {}
        for tier in TIER_ORDER:
            depth, oldest = queued.get((service.pk, tier.value), (0, None))
            tiers[tier.value] = {
                "depth": depth,
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
