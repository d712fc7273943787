"""Priority tiers, plan boosts and aging. The queues they map to are in inference.queues."""

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


class Plan(models.TextChoices):
    ENTERPRISE = "enterprise", "Enterprise"
    PRO = "pro", "Pro"
    FREE = "free", "Free"


# AMQP message priority within a tier queue. Kept small: each level is a sub-queue in RabbitMQ.
PLAN_BOOST: dict[str, int] = {Plan.ENTERPRISE: 3, Plan.PRO: 2, Plan.FREE: 1}


# Aging: how long a tier may go unserved while it has work before a worker serves it first.
# Every waiting job ages at the same rate, so "serve a starving tier at least once per interval"
# bounds the wait of the lowest tier without re-publishing messages (RabbitMQ priorities are
# fixed once queued).
AGING_INTERVAL_S: dict[str, float] = {
    Tier.REALTIME: 0.0,
    Tier.API: 0.5,
    Tier.BATCH: 5.0,
    Tier.OFFLINE: 30.0,
}
