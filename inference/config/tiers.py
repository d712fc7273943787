"""Tier policies (config.yaml `tiers:`): how long a batch/offline job waits before it is promoted
one tier up (aging), a tier's share when tiers below realtime compete (weight), and the longest
local wait its jobs accept (target; realtime/api default to each service's timeouts).

    from inference.config.tiers import current_tier_policies, tier_policies, tier_policy
    tier_policy("batch").aging_after_s   # 30.0
    tier_policies()                       # {"realtime": TierPolicy(...), ...} in tier order
    current_tier_policies()               # the same, cached until the configuration changes

`tier_policies()` is one single-row read per call; code on a hot path (routing a submission)
uses `current_tier_policies()`, re-read after `ConfigWatcher.changed()` or a change saved in
this process.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from inference.config.changes import ConfigWatcher, config_changed
from inference.config.models import TIER_POLICY_KEYS, SchedulerSettings, default_tier_policies
from inference.jobs.tiers import TIER_ORDER, Tier

# What the keys a tier does not take stand for: realtime and api are never promoted
# (aging_after_s 0), realtime is outside the weighted share (weight 0).
_FIXED = {"aging_after_s": 0.0, "weight": 0.0}


@dataclass(frozen=True)
class TierPolicy:
    tier: str
    # Promote a job of this tier one tier up once it has waited this long (0 = never).
    aging_after_s: float
    # Relative share when several tiers below realtime have work (higher = more).
    weight: float
    # Longest local wait accepted before spilling over / scaling up; None = the service's
    # queue_timeout/total_timeout (interactive tiers).
    target_wait_s: float | None


def _policy(tier: str, stored: dict) -> TierPolicy:
    # Rows written before a key was taken away from a tier may still hold it: ignored.
    configured = {k: v for k, v in (stored or {}).items() if k in TIER_POLICY_KEYS[tier]}
    merged = {**_FIXED, **default_tier_policies()[tier], **configured}
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


_cache_lock = threading.Lock()
_cached: dict[str, TierPolicy] | None = None
_watcher = ConfigWatcher()


def current_tier_policies() -> dict[str, TierPolicy]:
    """tier_policies(), read again only once the configuration changed: at most one read of
    the change marker per RENQ_CONFIG_RECHECK_S."""
    global _cached
    with _cache_lock:
        # The marker first: a change after this look is seen by the next one.
        if _watcher.changed() or _cached is None:
            _cached = tier_policies()
        return _cached


def forget_tier_policies(**_kwargs) -> None:
    global _cached
    with _cache_lock:
        _cached = None


config_changed.connect(forget_tier_policies, dispatch_uid="renq-tier-policies-forget")
