"""Jain's fairness index between the tenants of one tier, the maths and its inputs' shape.

J = (Σx)² / (n·Σx²) over the n tenants with queued work in the tier now, x being each tenant's
served work over the last FAIRNESS_WINDOW divided by its plan's weight: 1.0 when every
backlogged tenant got service in proportion to its weight, 1/n when one tenant got it all.

The plan weights belong to inference.config (a floor this one may not import): the app wires
them in at start-up with use_plan_weights.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta

# Long enough to span many batches of every tenant, short enough to show a starvation while
# it lasts.
FAIRNESS_WINDOW = timedelta(minutes=5)

PlanWeight = Callable[[str], float]


def _equal_weights(_plan: str) -> float:
    return 1.0


_plan_weight: PlanWeight = _equal_weights


def use_plan_weights(weight: PlanWeight) -> None:
    """Weigh each tenant's served work by its plan (inference.config.plans.plan_weight)."""
    global _plan_weight
    _plan_weight = weight


def plan_weight(plan: str) -> float:
    return _plan_weight(plan)


def jain_index(values: Iterable[float]) -> float:
    """Jain's index of `values` (non-negative): 1.0 for equal values, 1/n for one non-zero
    among n. No values, or all zero (nobody was served more than anybody), is 1.0: equal."""
    xs = [float(x) for x in values]
    if any(x < 0 for x in xs):
        raise ValueError("Jain's index is defined for non-negative values")
    total = sum(xs)
    if not xs or total == 0:
        return 1.0
    return total * total / (len(xs) * sum(x * x for x in xs))


def weighted_shares(served: dict, plans: dict) -> list[float]:
    """Each backlogged tenant's served work over its plan's weight: `plans` maps the
    backlogged tenants to their plans, `served` (tenant → work) may lack the starved ones."""
    return [served.get(tenant, 0) / max(plan_weight(plan), 1e-9) for tenant, plan in plans.items()]
