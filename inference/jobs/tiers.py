"""Priority tiers, plan boosts (tier entitlements, message priority) and aging. The queues
they map to are in inference.dispatch.queues."""

from __future__ import annotations

from django.db import models


class Tier(models.TextChoices):
    REALTIME = "realtime", "P0 realtime"
    API = "api", "P1 api"
    BATCH = "batch", "P2 batch"
    OFFLINE = "offline", "P3 offline"

    @property
    def rank(self) -> int:
        """0 is served first."""
        return TIER_ORDER.index(self)

    @property
    def is_interactive(self) -> bool:
        # Queue/total timeouts are latency promises; batch and offline work waits as long as it
        # takes (aging guarantees it runs) instead of expiring.
        return self in (Tier.REALTIME, Tier.API)


TIER_ORDER: tuple[Tier, ...] = (Tier.REALTIME, Tier.API, Tier.BATCH, Tier.OFFLINE)
# The tiers' names, for membership tests on every job (Tier.values builds a list per call).
TIER_NAMES: frozenset[str] = frozenset(tier.value for tier in TIER_ORDER)


class Plan(models.TextChoices):
    ENTERPRISE = "enterprise", "Enterprise"
    PRO = "pro", "Pro"
    FREE = "free", "Free"


# How many tiers a plan's jobs move from the tier they ask for (negative = up, towards realtime),
# clamped to P0..P3: the product's entitlement table. config.yaml `plans:` overrides it
# (inference.config.plans).
DEFAULT_TIER_BOOST: dict[str, int] = {Plan.ENTERPRISE: -1, Plan.PRO: 0, Plan.FREE: 1}


def boosted_tier(requested: str, boost: int) -> Tier:
    """The tier `boost` ranks away from `requested`, clamped to realtime..offline."""
    rank = min(max(Tier(requested).rank + boost, 0), len(TIER_ORDER) - 1)
    return TIER_ORDER[rank]


def promises_latency(served: str, requested: str = "") -> bool:
    """Whether a job's queue_timeout/total_timeout apply: served in an interactive tier and
    asked for one. A batch request that the plan serves as api still waits as long as it takes
    rather than expiring; an api request served as batch likewise (`requested` "": as served)."""
    return Tier(served).is_interactive and Tier(requested or served).is_interactive


# AMQP message priority within a tier queue. Kept small: each level is a sub-queue in RabbitMQ.
PLAN_BOOST: dict[str, int] = {Plan.ENTERPRISE: 3, Plan.PRO: 2, Plan.FREE: 1}


# Aging: a job that has waited this long in its tier's queue is promoted one tier up (and again
# after the next tier's threshold), for every worker at once (the sweep re-publishes it; the
# claim makes the stale copy harmless). Only batch and offline age: promoting api would put
# work into realtime, and realtime is the top.
AGING_INTERVAL_S: dict[str, float] = {
    Tier.BATCH: 30.0,
    Tier.OFFLINE: 60.0,
}
# Aging stops below realtime: P0 stays strict, for jobs submitted as realtime.
HIGHEST_PROMOTION = Tier.API
