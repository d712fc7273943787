"""Which backend runs a job: `Router.choose(request) -> RoutingDecision`.

The caller describes the job as a `RoutingRequest` (routing knows nothing of jobs).

1. Candidates: the route's enabled backends configured to serve the job (its service kind,
   its longest sequence within max_context_tokens — the local model truncates each sequence
   at its own max length —, and for a cloud backend the API key's variable set) and healthy
   (not cooling down after a 429, breaker not open, rate-limit headroom left, upstream's
   remaining quota not 0, and a worker to carry it out: a GPU worker consuming the service's
   queues for the local backend, an I/O worker for a cloud one). When no backend is
   configured to serve the job, `choose` raises NoBackendCanServe: the job is refused at the
   door rather than failed later.
2. Capacity-aware spill-over: the local backend wins whenever its predicted wait meets the
   job's tier target (`routing.capacity`); cheap local GPU first. Only when it would break the
   target does the job go to the cloud, so realtime spills under a backlog and offline waits.
3. Among cloud candidates the lowest score wins:

       score = expected_latency_s × (1 + HEADROOM_PENALTY × (1 − headroom))
               + expected_cost_usd × SECONDS_PER_USD

   expected_latency_s is the moving average of real calls (until measured: the fastest
   measured backend's, so new backends get tried), headroom
   the smallest share left of the backend's rpm/tpm window (1 untouched, 0 refused), and the
   cost is the job's estimated tokens at the backend's prices.
4. A/B: entries sharing the winner's `order` form a group, split by `weight` with a shared
   counter in Redis (a low-discrepancy sequence), so the split is exact across all web
   processes rather than random. Weight 0 takes a variant out (rollback) but keeps it as a
   fallback.

The cascade (`routing.cascade`) uses `fallback_after` for the next backend after a failure:
the next untried, healthy entry at the same or a later order.
"""

from __future__ import annotations

import math
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from renq_site.shared_redis import shared_redis
from routing.backends import Placement
from routing.breaker import CircuitBreaker
from routing.limits import RateLimitTracker
from routing.models import Backend, RouteEntry
from routing.request import LocalWait, RoutingRequest
from routing.stats import measured_latency_s

# A backend at the end of its rate window looks this much slower (×2 at 0 headroom).
HEADROOM_PENALTY = 1.0
# How many seconds of latency one dollar is worth: $0.001 per job weighs like 1 s.
SECONDS_PER_USD = 1000.0
# Latency assumed when no cloud backend of the route has been measured yet.
PRIOR_CLOUD_LATENCY_S = 0.5
# Golden-ratio step of the A/B sequence: n × φ mod 1 spreads picks evenly for any weights.
_GOLDEN = (math.sqrt(5) - 1) / 2


class NoBackendCanServe(Exception):
    """No backend of the route is configured to serve the job (its kind, its size, or a
    missing API key): it would fail on every one. `reasons`: one per backend; `too_large`:
    the job's size is what every one refuses."""

    def __init__(self, reasons: Sequence[str], *, too_large: bool = False):
        self.reasons = list(reasons)
        self.too_large = too_large
        super().__init__("no configured backend can serve this job: " + "; ".join(reasons))


@dataclass
class Candidate:
    entry: RouteEntry
    available: bool = True
    why_not: str = ""
    # Not available as configured (kind, context, missing key): never chosen, not even as
    # the last resort, whatever its health.
    unservable: bool = False
    too_large: bool = False
    headroom: float = 1.0
    latency_s: float = 0.0
    measured_latency_s: float | None = None
    cost_usd: float = 0.0
    score: float | None = None

    @property
    def backend(self) -> Backend:
        return self.entry.backend

    @property
    def is_local(self) -> bool:
        return self.backend.adapter().placement is Placement.LOCAL_WORKERS


@dataclass
class RoutingDecision:
    backend: Backend | None
    reason: str
    predicted_local_wait_s: float | None = None
    scores: dict[str, float] = field(default_factory=dict)


# Routes change rarely and are read for every job: cached per process, dropped by the caller
# when its configuration change marker moves (inference.intake.lookups) or at ROUTE_CACHE_TTL_S.
ROUTE_CACHE_TTL_S = 5.0
_routes: dict[int, tuple[float, list[RouteEntry]]] = {}


def route_entries(service_id: int) -> list[RouteEntry]:
    """The service's enabled route, in cascade order; [] when it has none."""
    cached = cached_route_entries(service_id)
    if cached is not None:
        return cached
    entries = list(
        RouteEntry.objects.filter(
            route__service_id=service_id, route__enabled=True, backend__enabled=True
        )
        .select_related("backend", "route")
        .order_by("order", "id")
    )
    _routes[service_id] = (time.monotonic() + ROUTE_CACHE_TTL_S, entries)
    return entries


def cached_route_entries(service_id: int) -> list[RouteEntry] | None:
    """route_entries as this process has them cached, or None when it has not (never
    queries): for a caller that must not wait on Postgres."""
    cached = _routes.get(service_id)
    return cached[1] if cached is not None and cached[0] > time.monotonic() else None


def forget_routes() -> None:
    _routes.clear()


class Router:
    def __init__(
        self,
        *,
        limits: RateLimitTracker | None = None,
        breaker: CircuitBreaker | None = None,
    ):
        client = shared_redis()
        self.limits = limits or RateLimitTracker(client)
        self.breaker = breaker or CircuitBreaker(client)

    # --- health and scores ----------------------------------------------------------------

    @staticmethod
    def too_large_reason(backend: Backend, request: RoutingRequest) -> str | None:
        """Why the job's longest input does not fit `backend`'s context window, or None."""
        context = backend.adapter().context_tokens(request)
        if context <= backend.max_context_tokens:
            return None
        return (
            f"this job's longest input (~{context} tokens) exceeds its max_context_tokens "
            f"{backend.max_context_tokens}"
        )

    @classmethod
    def unservable_reason(cls, backend: Backend, request: RoutingRequest) -> str | None:
        """Why `backend` as configured can never serve this job, or None. No Redis, no broker:
        the kind, the context window and the adapter's configuration only."""
        if request.service_kind not in (backend.service_kinds or []):
            return f"does not serve {request.service_kind} jobs"
        too_large = cls.too_large_reason(backend, request)
        if too_large:
            return too_large
        adapter = backend.adapter()
        misconfiguration = adapter.misconfiguration()
        if misconfiguration:
            return f"misconfigured: {misconfiguration}"
        return None

    @classmethod
    def refusal(cls, request: RoutingRequest) -> NoBackendCanServe | None:
        """NoBackendCanServe when the service has a route and none of its backends is
        configured to serve this job; None otherwise. Static, as `unservable_reason`."""
        entries = route_entries(request.service_id)
        reasons = [
            (entry.backend, cls.unservable_reason(entry.backend, request)) for entry in entries
        ]
        if not entries or any(reason is None for _, reason in reasons):
            return None
        return NoBackendCanServe(
            [f"{backend.name}: {reason}" for backend, reason in reasons],
            too_large=all(cls.too_large_reason(backend, request) for backend, _ in reasons),
        )

    def serving_backend_ids(self, request: RoutingRequest) -> frozenset[int]:
        """The route's backends configured to serve this job (see `unservable_reason`)."""
        return frozenset(
            entry.backend_id
            for entry in route_entries(request.service_id)
            if self.unservable_reason(entry.backend, request) is None
        )

    def assess(self, entry: RouteEntry, request: RoutingRequest) -> Candidate:
        backend = entry.backend
        candidate = Candidate(entry)
        why_not = self.unservable_reason(backend, request)
        if why_not:
            candidate.available = False
            candidate.unservable = True
            candidate.too_large = self.too_large_reason(backend, request) is not None
            candidate.why_not = why_not
            return candidate
        state = self.breaker.peek(backend)
        if not state.allowed:
            candidate.available = False
            candidate.why_not = f"circuit breaker {state.state}"
            return candidate
        why_not = backend.adapter().unavailable_reason(request)
        if why_not:
            candidate.available = False
            candidate.why_not = why_not
            return candidate
        if candidate.is_local:
            return candidate  # its capacity is judged by the predicted wait, below
        status = self.limits.status(backend)
        if status.cooling_down:
            candidate.available = False
            candidate.why_not = (
                f"cooling down after 429 for {status.cooldown_until - status.now:.1f} s more"
            )
            return candidate
        candidate.headroom = self.limits.headroom(backend, request.tokens)
        if candidate.headroom <= 0:
            candidate.available = False
            candidate.why_not = "rate limit reached (configured rpm/tpm or upstream remaining)"
            return candidate
        candidate.measured_latency_s = measured_latency_s(backend.pk)
        candidate.cost_usd = float(backend.cost_of(request.input_tokens, request.output_tokens))
        return candidate

    @staticmethod
    def score(candidates: Sequence[Candidate]) -> None:
        """Fill in latency and score of the available cloud candidates. A backend never
        measured is assumed as fast as the fastest measured one (optimistic, so new backends
        and backends back from a cooldown get traffic and a measurement)."""
        cloud = [c for c in candidates if c.available and not c.is_local]
        known = [c.measured_latency_s for c in cloud if c.measured_latency_s is not None]
        prior = min(known) if known else PRIOR_CLOUD_LATENCY_S
        for c in cloud:
            c.latency_s = c.measured_latency_s if c.measured_latency_s is not None else prior
            c.score = (
                c.latency_s * (1 + HEADROOM_PENALTY * (1 - c.headroom))
                + c.cost_usd * SECONDS_PER_USD
            )

    def _ab_pick(self, group: Sequence[Candidate], route_id: int, order: int) -> Candidate:
        weighted = [c for c in group if c.entry.weight > 0]
        if len(weighted) <= 1:
            return weighted[0] if weighted else min(group, key=lambda c: c.score or 0.0)
        total = sum(c.entry.weight for c in weighted)
        n = shared_redis().incr(f"renq:ab:{route_id}:{order}")
        point = (n * _GOLDEN) % 1.0 * total
        for candidate in weighted:
            point -= candidate.entry.weight
            if point < 0:
                return candidate
        return weighted[-1]

    # --- decisions ------------------------------------------------------------------------

    def choose(self, request: RoutingRequest) -> RoutingDecision | None:
        """None when the service has no enabled route (its jobs run locally, as always).
        Raises NoBackendCanServe when no backend of the route is configured to serve it."""
        entries = route_entries(request.service_id)
        if not entries:
            return None
        tier = request.tier
        # The common case first: the local workers are there and fast enough. Then no cloud
        # backend needs assessing (each costs rate-limit and breaker reads in Redis).
        local_entry = next(
            (e for e in entries if e.backend.adapter().placement is Placement.LOCAL_WORKERS), None
        )
        if local_entry is not None:
            local = self.assess(local_entry, request)
            if local.available:
                wait = request.workers.predicted_wait()
                if wait.meets_target:
                    return _local_decision(
                        local.backend, wait, tier, {local.backend.name: round(wait.wait_s, 6)}
                    )
        candidates = [self.assess(entry, request) for entry in entries]
        if all(c.unservable for c in candidates):
            raise NoBackendCanServe(
                [f"{c.backend.name}: {c.why_not}" for c in candidates],
                too_large=all(c.too_large for c in candidates),
            )
        self.score(candidates)
        scores = {c.backend.name: round(c.score, 6) for c in candidates if c.score is not None}
        local = next((c for c in candidates if c.is_local), None)
        wait: LocalWait | None = None
        local_note = ""
        if local is not None:
            wait = request.workers.predicted_wait()
            scores[local.backend.name] = round(wait.wait_s, 6)
            if local.available and wait.meets_target:
                return _local_decision(local.backend, wait, tier, scores)
            local_note = (
                f"local {local.why_not}; "
                if not local.available
                else f"spill-over: predicted local wait {wait.wait_s:.2f} s ({wait.jobs_ahead} "
                f"jobs at {wait.throughput_jobs_s:.1f}/s) exceeds the {tier} target "
                f"{wait.target_s:g} s; "
            )
        cloud = [c for c in candidates if c.available and not c.is_local]
        predicted = wait.wait_s if wait is not None else None
        if cloud:
            best = min(cloud, key=lambda c: c.score)
            group = [c for c in cloud if c.entry.order == best.entry.order]
            chosen = self._ab_pick(group, best.entry.route_id, best.entry.order)
            split = f"; skipped {_skips(candidates)}" if _skips(candidates) else ""
            if len(group) > 1:
                total = sum(c.entry.weight for c in group)
                split = (
                    f"; A/B group order {chosen.entry.order}: weight {chosen.entry.weight}/{total}"
                )
            return RoutingDecision(
                chosen.backend,
                f"{local_note}{chosen.backend.name} scored {chosen.score:.3f} (latency "
                f"{chosen.latency_s:.3f} s, cost ${chosen.cost_usd:.6f}, headroom "
                f"{chosen.headroom:.2f}){split}",
                predicted,
                scores,
            )
        if local is not None and local.available:
            return RoutingDecision(
                local.backend,
                f"{local_note}no cloud backend available ({_skips(candidates)}): waiting for "
                f"the local workers",
                predicted,
                scores,
            )
        # Nothing healthy: send it down the cascade from the first backend that could serve
        # it; each unavailable one is skipped there, and the job fails with every reason
        # instead of waiting forever. One that can never serve it is no last resort.
        first = next(c for c in candidates if not c.unservable)
        return RoutingDecision(
            first.backend,
            f"no backend available ({_skips(candidates)}); trying {first.backend.name}",
            predicted,
            scores,
        )

    def fallback_after(
        self, request: RoutingRequest, failed: Backend, tried: Collection[int]
    ) -> tuple[RoutingDecision | None, list[str]]:
        """The next backend after `failed`: untried, healthy, at the same or a later order.
        Returns (decision or None, why each skipped backend was skipped)."""
        entries = route_entries(request.service_id)
        failed_order = next((e.order for e in entries if e.backend_id == failed.pk), -1)
        skipped: list[str] = []
        by_order: dict[int, list[Candidate]] = {}
        for entry in entries:
            if entry.order < failed_order or entry.backend_id in tried:
                continue
            candidate = self.assess(entry, request)
            if not candidate.available:
                skipped.append(f"{entry.backend.name}: skipped ({candidate.why_not})")
                continue
            by_order.setdefault(entry.order, []).append(candidate)
        if not by_order:
            return None, skipped
        order = min(by_order)
        group = by_order[order]
        chosen = self._ab_pick(group, group[0].entry.route_id, order)
        reason = f"fallback after {failed.name} failed: next in cascade is {chosen.backend.name}"
        if skipped:
            reason += f" ({'; '.join(skipped)})"
        return RoutingDecision(chosen.backend, reason, None, {}), skipped


def _skips(candidates: Sequence[Candidate]) -> str:
    return "; ".join(f"{c.backend.name}: {c.why_not}" for c in candidates if not c.available)


def _local_decision(backend, wait: LocalWait, tier: str, scores: dict) -> RoutingDecision:
    """The local workers, because their predicted wait meets the tier's target."""
    return RoutingDecision(
        backend,
        f"local: predicted wait {wait.wait_s:.2f} s ({wait.jobs_ahead} jobs at "
        f"{wait.throughput_jobs_s:.1f}/s) meets the {tier} target {wait.target_s:g} s",
        wait.wait_s,
        scores,
    )
