"""The tier a submission is served in: the tier it asks for moved by the tenant's plan (its
tier boost, clamped to P0..P3), then, for realtime, the plan's realtime cap: past a tenant's
`realtime_cap` jobs in the current second, realtime jobs are served as api, which keeps P0
(served strictly) open to every tenant. Demoted, not refused: the client asked for an answer,
and api still gets one ahead of batch work.

The cap is a Redis counter per tenant per second, shared by every web process, reserved with
the request's other counters and given back if the request is refused further on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from inference.config.plans import effective_tier, plan_policy
from inference.intake.admission import CounterReservation
from inference.jobs.tiers import Tier
from inference.models import Tenant
from renq_site.shared_redis import shared_redis

_CAP_KEY_TTL_S = 2


@dataclass(frozen=True)
class TierChoice:
    requested: Tier
    served: Tier
    # Why `served` is not `requested` ("" when it is).
    reason: str = ""


def plan_tier(requested: Tier, tenant: Tenant) -> TierChoice:
    """The tier the plan's tier boost entitles a request for `requested` to."""
    served = effective_tier(requested, tenant.plan)
    if served == requested:
        return TierChoice(requested, served)
    boost = plan_policy(tenant.plan).tier_boost
    return TierChoice(requested, served, f"{tenant.plan} plan: tier boost {boost:+d}")


def realtime_cap_reason(tenant: Tenant, cap: int) -> str:
    return f"{tenant.plan} plan: realtime cap of {cap} jobs/s reached, served as api"


def reserve_realtime(
    tenant: Tenant, wanted: int, reservation: CounterReservation
) -> tuple[int, int | None]:
    """How many of `wanted` realtime jobs the tenant's plan lets run as realtime this second,
    and the cap (None: no cap, all of them). The admitted ones are added to `reservation`, so a
    refused request gives them back."""
    cap = plan_policy(tenant.plan).realtime_cap
    if cap is None or wanted <= 0:
        return wanted, cap
    key = f"renq:realtime-cap:{tenant.pk}:{int(time.time())}"
    pipe = shared_redis().pipeline()
    pipe.incrby(key, wanted)
    pipe.expire(key, _CAP_KEY_TTL_S)
    count, _ = pipe.execute()
    admitted = max(0, min(wanted, cap - (int(count) - wanted)))
    if admitted < wanted:
        # The counter counts the jobs served as realtime, not those turned away.
        shared_redis().decrby(key, wanted - admitted)
    if admitted:
        reservation.keys.append((key, admitted))
    return admitted, cap
