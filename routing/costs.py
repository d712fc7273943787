"""Cost accounting: what attempts cost, per tenant and per backend, and what routing saved.

"Saved vs all-cloud" prices the same succeeded jobs (their real token usage) on the cheapest
priced cloud backend of their service's route, and subtracts what they actually cost
(local = 0). Free tiers are left out of that baseline when a priced backend exists: their rate
limits (e.g. 20 requests/min) could never carry the whole load, so "all on the free tier" is
not a price anyone could pay.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from decimal import Decimal

from django.db.models import Count, Q, Sum

from routing.models import AttemptOutcome, Backend, BackendKind, JobAttempt, RouteEntry


@dataclass
class TenantCost:
    tenant: str
    jobs: int
    cost: Decimal
    all_cloud_cost: Decimal

    @property
    def saved(self) -> Decimal:
        return self.all_cloud_cost - self.cost


@dataclass
class BackendCost:
    backend: str
    attempts: int
    succeeded: int
    input_tokens: int
    output_tokens: int
    cost: Decimal


def cheapest_cloud_by_service() -> dict[int, list[Backend]]:
    """Priced cloud backends of each service's route (the cheapest is picked per usage); the
    free ones only where a route has nothing priced."""
    clouds: dict[int, list[Backend]] = defaultdict(list)
    for entry in RouteEntry.objects.filter(backend__kind=BackendKind.OPENAI).select_related(
        "backend", "route"
    ):
        clouds[entry.route.service_id].append(entry.backend)
    for service_id, backends in clouds.items():
        priced = [b for b in backends if b.cost_per_1k_input or b.cost_per_1k_output]
        clouds[service_id] = priced or backends
    return clouds


def costs_by_backend(attempts=None) -> list[BackendCost]:
    attempts = attempts if attempts is not None else JobAttempt.objects.all()
    rows = (
        attempts.values("backend__name")
        .annotate(
            attempts=Count("id"),
            succeeded=Count("id", filter=Q(outcome=AttemptOutcome.SUCCEEDED)),
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
            cost=Sum("cost"),
        )
        .order_by("backend__name")
    )
    return [
        BackendCost(
            backend=r["backend__name"],
            attempts=r["attempts"],
            succeeded=r["succeeded"],
            input_tokens=r["input_tokens"] or 0,
            output_tokens=r["output_tokens"] or 0,
            cost=r["cost"] or Decimal("0"),
        )
        for r in rows
    ]


def costs_by_tenant(attempts=None) -> list[TenantCost]:
    attempts = attempts if attempts is not None else JobAttempt.objects.all()
    spent = {
        r["job__tenant__name"]: r["cost"] or Decimal("0")
        for r in attempts.values("job__tenant__name").annotate(cost=Sum("cost"))
    }
    usage = (
        attempts.filter(outcome=AttemptOutcome.SUCCEEDED)
        .values("job__tenant__name", "job__service_id")
        .annotate(
            jobs=Count("job_id", distinct=True), inp=Sum("input_tokens"), out=Sum("output_tokens")
        )
    )
    clouds = cheapest_cloud_by_service()
    jobs: dict[str, int] = defaultdict(int)
    all_cloud: dict[str, Decimal] = defaultdict(Decimal)
    for row in usage:
        tenant = row["job__tenant__name"]
        jobs[tenant] += row["jobs"]
        options = clouds.get(row["job__service_id"], [])
        if options:
            all_cloud[tenant] += min(b.cost_of(row["inp"] or 0, row["out"] or 0) for b in options)
    return [
        TenantCost(tenant, jobs.get(tenant, 0), spent[tenant], all_cloud.get(tenant, Decimal(0)))
        for tenant in sorted(spent)
    ]
