"""Prometheus's scrape: every process's events (inference.metrics.events, multiprocess mode)
and the state computed now (queue depth, running jobs, fairness between tenants, backend limits
and breakers, and the autoscaler's decision that inference.apps adds)."""

from __future__ import annotations

import logging
import os

from celery.signals import worker_ready
from django.db.models import Count, Sum
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    generate_latest,
    multiprocess,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily

from inference.jobs.status import JobStatus
from inference.jobs.tiers import TIER_ORDER
from inference.metrics.events import METRICS_DIR
from inference.metrics.fairness import FAIRNESS_WINDOW, jain_index, weighted_shares
from inference.metrics.queue_depth import WAITING_TIER, queue_depths, queued_jobs
from inference.models import Job, Service
from renq_site.shared_redis import shared_redis
from routing.breaker import CircuitBreaker
from routing.limits import RateLimitTracker
from routing.models import Backend

logger = logging.getLogger(__name__)


# --- state, computed at scrape time --------------------------------------------------------------


class StateCollector:
    """Gauges read from Postgres and Redis when Prometheus scrapes."""

    def collect(self):
        yield from self._queues()
        yield from self._fairness()
        yield from self._backends()

    @staticmethod
    def _queues():
        depth = GaugeMetricFamily(
            "renq_queue_depth",
            "Jobs queued (waiting for a worker), per service and the tier queue they wait in "
            "(bulk pieces included), as admission counts them.",
            labels=["service", "tier"],
        )
        running = GaugeMetricFamily(
            "renq_jobs_running", "Jobs claimed by a worker now, per service.", labels=["service"]
        )
        try:
            queued = queue_depths()
            busy = dict(
                Job.objects.filter(status=JobStatus.RUNNING, is_bulk=False)
                .values_list("service_id")
                .annotate(n=Count("pk"))
                .order_by()
            )
            # Every active service and tier appears, at 0 when idle: dashboards and autoscalers
            # need the series to exist.
            for pk, service in Service.objects.filter(active=True).values_list("pk", "name"):
                for tier in TIER_ORDER:
                    depth.add_metric([service, tier.value], queued.get((pk, tier.value), (0,))[0])
                running.add_metric([service], busy.get(pk, 0))
        except Exception:
            logger.exception("metrics: could not count queued jobs")
        yield depth
        yield running

    @staticmethod
    def _fairness():
        """Jain's index per service and tier over the tenants with queued work there now (see
        inference.metrics.fairness): two GROUP BYs, the queued jobs' tenants, then what those
        tenants had served within the window (only where two or more of them wait)."""
        index = GaugeMetricFamily(
            "renq_fairness_index",
            "Jain's index of the weighted work served over the last minutes to the tenants "
            "with queued jobs, per service and tier (1 = fair; 1 with fewer than 2 such tenants).",
            labels=["service", "tier"],
        )
        backlogged = GaugeMetricFamily(
            "renq_backlogged_tenants",
            "Tenants with queued jobs, per service and tier.",
            labels=["service", "tier"],
        )
        try:
            # The tier queue a job waits (or waited) in: its own, or the one aging moved it to.
            waiting_in = WAITING_TIER
            plans: dict[tuple[str, str], dict[int, str]] = {}
            for service, tier, tenant, plan in (
                queued_jobs()
                .annotate(waiting_tier=waiting_in)
                .values_list("service__name", "waiting_tier", "tenant_id", "tenant__plan")
                .distinct()
                .order_by()
            ):
                plans.setdefault((service, tier), {})[tenant] = plan
            tokens: dict[tuple[str, str], dict[int, int]] = {}
            jobs: dict[tuple[str, str], dict[int, int]] = {}
            contended = [key for key, tenants in plans.items() if len(tenants) > 1]
            if contended:
                for service, tier, tenant, n_tokens, n_jobs in (
                    Job.objects.filter(
                        status=JobStatus.SUCCEEDED,
                        is_bulk=False,
                        finished_at__gte=timezone.now() - FAIRNESS_WINDOW,
                        service__name__in={service for service, _ in contended},
                        tenant_id__in={t for key in contended for t in plans[key]},
                    )
                    .annotate(waiting_tier=waiting_in)
                    .values_list("service__name", "waiting_tier", "tenant_id")
                    .annotate(tokens=Sum("input_tokens"), jobs=Count("pk"))
                    .order_by()
                ):
                    tokens.setdefault((service, tier), {})[tenant] = n_tokens or 0
                    jobs.setdefault((service, tier), {})[tenant] = n_jobs
            for service in Service.objects.filter(active=True).values_list("name", flat=True):
                for tier in TIER_ORDER:
                    key = (service, tier.value)
                    tenants = plans.get(key, {})
                    backlogged.add_metric(list(key), len(tenants))
                    # Work in tokens where the service counts them, else in jobs.
                    served = tokens.get(key, {})
                    if not any(served.values()):
                        served = jobs.get(key, {})
                    fair = jain_index(weighted_shares(served, tenants)) if len(tenants) > 1 else 1.0
                    index.add_metric(list(key), fair)
        except Exception:
            logger.exception("metrics: could not compute the fairness index")
        yield index
        yield backlogged

    @staticmethod
    def _backends():
        headroom = GaugeMetricFamily(
            "renq_backend_rate_limit_headroom",
            "Share of the backend's tightest rate limit left (0 = would be refused, 1 = idle).",
            labels=["backend"],
        )
        cooldown = GaugeMetricFamily(
            "renq_backend_cooldown",
            "1 while the backend cools down after a 429, else 0.",
            labels=["backend"],
        )
        breaker_state = GaugeMetricFamily(
            "renq_backend_breaker_state",
            "Circuit breaker state of the backend (1 for the current state).",
            labels=["backend", "state"],
        )
        try:
            client = shared_redis()
            limits, breaker = RateLimitTracker(client), CircuitBreaker(client)
            for backend in Backend.objects.filter(enabled=True):
                status = limits.status(backend)
                headroom.add_metric([backend.name], limits.headroom(backend))
                cooldown.add_metric([backend.name], 1.0 if status.cooling_down else 0.0)
                current = breaker.peek(backend).state
                for state in ("closed", "open", "half_open"):
                    on = current == state or (state == "half_open" and current.startswith(state))
                    breaker_state.add_metric([backend.name, state], 1.0 if on else 0.0)
        except Exception:
            logger.exception("metrics: could not read backend limits")
        yield headroom
        yield cooldown
        yield breaker_state


# State computed by the wings above this one (the autoscaler's decision, in inference.dispatch):
# inference.apps adds their collectors at start-up, so this module imports none of them.
_wing_collectors: list = []


def add_state_collector(collector) -> None:
    """Scrape `collector` (an object with `collect()` yielding metric families) with the state."""
    if collector not in _wing_collectors:
        _wing_collectors.append(collector)


def registry(*, with_state: bool = True) -> CollectorRegistry:
    """Every process's events (plus the state now), in one registry (fresh per scrape, as
    prometheus-client's multiprocess mode requires)."""
    scrape = CollectorRegistry()
    multiprocess.MultiProcessCollector(scrape, path=METRICS_DIR)
    if with_state:
        scrape.register(StateCollector())
        for collector in _wing_collectors:
            scrape.register(collector)
    return scrape


@never_cache
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    return HttpResponse(generate_latest(registry()), content_type=CONTENT_TYPE_LATEST)


@worker_ready.connect
def serve_worker_metrics(**_kwargs) -> None:
    """Containers do not share PROMETHEUS_MULTIPROC_DIR with the web: with RENQ_METRICS_PORT
    set, a worker serves its own processes' events (not the state: the web serves that once)."""
    port = os.environ.get("RENQ_METRICS_PORT")
    if port:
        start_http_server(int(port), registry=registry(with_state=False))
        logger.info("metrics on :%s/metrics", port)
