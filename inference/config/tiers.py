"""Tier policies (config.yaml `tiers:`): how long a tier may wait unserved before it is served
first (aging), its share when tiers compete (weight), and the longest local wait its jobs
accept (target; realtime/api take theirs from each service's timeouts).

    from inference.config.tiers import tier_policies, tier_policy
    tier_policy("batch").aging_after_s   # 5.0
    tier_policies()                       # {"realtime": TierPolicy(...), ...} in tier order

One single-row read per call; a long-running loop caches the result and re-reads when
`inference.config.changes.ConfigWatcher.changed()` says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from inference.config.models import SchedulerSettings, default_tier_policies
from inference.jobs.tiers import TIER_ORDER, Tier

TIER_POLICY_FIELDS = ("aging_after_s", "weight", "target_wait_s")


@dataclass(frozen=True)
class TierPolicy:
    tier: str
    # Serve this tier first once it has had work waiting this long unserved (0 = always first).
    aging_after_s: float
    # Relative share when several tiers are due at once (higher = more).
    weight: float
    # Longest local wait accepted before spilling over / scaling up; None = the service's
    # queue_timeout/total_timeout (interactive tiers).
    target_wait_s: float | None


def _policy(tier: str, stored: dict) -> TierPolicy:
    merged = {**default_tier_policies()[tier], **(stored or {})}
    target = merged.get("target_wait_s")
    return TierPolicy(
        tier=tier,
        aging_after_s=float(merged["aging_after_s"]),
        weight=float(merged["weight"]),
        target_wait_s=None if target is None else float(target),
    )


def tier_policies() -> dict[str, TierPolicy]:
    stored = SchedulerSettings.objects.filter(pk=SchedulerSettings.SINGLETON_PK).first()
    tiers = stored.tiers if stored is not None else {}
    return {tier.value: _policy(tier.value, tiers.get(tier.value, {})) for tier in TIER_ORDER}


def tier_policy(tier: str) -> TierPolicy:
    return tier_policies()[Tier(tier).value]
