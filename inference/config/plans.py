"""What a tenant's plan buys inside the scheduler (config.yaml `plans:`, the admin's plan
policies): a tier boost applied to the tier a job asks for, clamped to P0..P3 (enterprise -1,
pro 0, free +1 by default), a realtime cap (jobs/s per tenant served as realtime; beyond it,
api), and its weight in the fair share between the tenants of one tier (enterprise > pro >
free).

    from inference.config.plans import effective_tier, plan_policy, plan_weight
    plan_policy("free").tier_boost       # 1
    effective_tier("realtime", "free")   # Tier.API
    plan_weight("enterprise")            # 2.0

Read on every submission: cached per process, read again after the configuration change
marker moves (as inference.config.tiers does).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from inference.config.changes import ConfigWatcher, config_changed
from inference.config.models import PlanPolicy, default_plan_policies
from inference.jobs.tiers import Tier, boosted_tier

__all__ = [
    "PlanEntitlement",
    "effective_tier",
    "plan_policies",
    "plan_policy",
    "plan_weight",
]


@dataclass(frozen=True)
class PlanEntitlement:
    plan: str
    # Tiers added to the requested tier (negative: towards realtime), clamped.
    tier_boost: int
    # Share of a contended tier relative to other plans' tenants.
    weight: float
    # Realtime jobs per second per tenant; None = no cap.
    realtime_cap: int | None


def plan_policies() -> dict[str, PlanEntitlement]:
    """Every plan's policy: its stored row, else the defaults. One query."""
    policies = default_plan_policies()
    for row in PlanPolicy.objects.values("plan", "tier_boost", "weight", "realtime_cap"):
        if row["plan"] in policies:
            policies[row.pop("plan")] = row
    return {
        plan: PlanEntitlement(
            plan=plan,
            tier_boost=int(policy["tier_boost"]),
            weight=float(policy["weight"]),
            realtime_cap=policy["realtime_cap"],
        )
        for plan, policy in policies.items()
    }


_cache_lock = threading.Lock()
_cached: dict[str, PlanEntitlement] | None = None
_watcher = ConfigWatcher()


def current_plan_policies() -> dict[str, PlanEntitlement]:
    """plan_policies(), read again only once the configuration changed."""
    global _cached
    with _cache_lock:
        # The marker first: a change after this look is seen by the next one.
        if _watcher.changed() or _cached is None:
            _cached = plan_policies()
        return _cached


def forget_plan_policies(**_kwargs) -> None:
    global _cached
    with _cache_lock:
        _cached = None


config_changed.connect(forget_plan_policies, dispatch_uid="renq-plan-policies-forget")

# A plan the table does not know (a row written before a plan was removed) is treated as pro:
# no boost, no cap, weight 1.
_NEUTRAL = PlanEntitlement(plan="", tier_boost=0, weight=1.0, realtime_cap=None)


def plan_policy(plan: str) -> PlanEntitlement:
    return current_plan_policies().get(plan, _NEUTRAL)


def plan_weight(plan: str) -> float:
    return plan_policy(plan).weight


def effective_tier(requested: str, plan: str) -> Tier:
    """The tier a job of this plan asking for `requested` is served in, before the realtime
    cap (which depends on the tenant's recent traffic: inference.intake.entitlements)."""
    return boosted_tier(requested, plan_policy(plan).tier_boost)
