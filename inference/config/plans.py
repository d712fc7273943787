"""What a tenant's plan buys inside the scheduler: its weight in the fair share between the
tenants of one tier (enterprise > pro > free)."""

from __future__ import annotations

from inference.jobs.tiers import Plan

# A tenant's share of a contended tier is proportional to its plan's weight.
DEFAULT_PLAN_WEIGHTS: dict[str, float] = {Plan.ENTERPRISE: 2.0, Plan.PRO: 1.0, Plan.FREE: 0.5}


def plan_weight(plan: str) -> float:
    return DEFAULT_PLAN_WEIGHTS.get(plan, 1.0)
