"""Prometheus metrics, named the way vLLM (`vllm:*`) and TEI (`te_*`) name theirs, with `renq_`.

Two kinds, and where they come from:

- events, recorded where they happen and summed over every process (prometheus-client's
  multiprocess mode: each process writes its own file under PROMETHEUS_MULTIPROC_DIR, default
  .run/prometheus; gunicorn workers and Celery pool processes alike):
    renq_request_queue_time_seconds{service,tier}   submission → forward pass started
    renq_e2e_request_latency_seconds{service,tier}  submission → final status stored
    renq_batch_size{service}, renq_batch_tokens{service}   per forward pass
    renq_inference_time_seconds{service,model}      per forward pass (batch)
    renq_time_to_first_token_seconds{service}       streaming answers (observe_time_to_first_token)
    renq_jobs_finished_total{service,tier,status,reason}
    renq_backend_attempts_total{backend,outcome}, renq_backend_cost_usd_total{backend}
    renq_tenant_cost_usd_total{tenant,backend}      only with RENQ_METRICS_TENANT_LABELS=true
- state, computed when Prometheus scrapes (no process has to keep it current):
    renq_queue_depth{service,tier}, renq_jobs_running{service}   one GROUP BY in Postgres
    renq_backend_rate_limit_headroom{backend}, renq_backend_cooldown{backend},
    renq_backend_breaker_state{backend,state}       from routing's Redis counters

Every recording function here catches and logs its own errors: a metric must never fail a
batch or a job. Call sites in the job lifecycle are one line each.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from celery.signals import worker_ready
from django.conf import settings
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

# Multiprocess mode must be chosen before the first metric exists: set the directory, then make
# sure prometheus-client's value class uses it even if a library imported it first.
METRICS_DIR = os.environ.setdefault(
    "PROMETHEUS_MULTIPROC_DIR", str(Path(settings.BASE_DIR) / ".run" / "prometheus")
)
Path(METRICS_DIR).mkdir(parents=True, exist_ok=True)

from prometheus_client import (  # noqa: E402
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
    multiprocess,
    start_http_server,
    values,
)
from prometheus_client.core import GaugeMetricFamily  # noqa: E402

from routing.attempts import attempts_recorded  # noqa: E402

if not getattr(values.ValueClass, "_multiprocess", False):
    values.ValueClass = values.get_value_class()

if TYPE_CHECKING:
    from inference.jobs.transitions import Outcome
    from inference.models import Job, Service

logger = logging.getLogger(__name__)

# Per-tenant cost series multiply with tenants: off unless the operator opts in (LiteLLM keeps
# end-user labels off by default for the same reason).
TENANT_LABELS = os.environ.get("RENQ_METRICS_TENANT_LABELS", "").lower() in {"1", "true", "yes"}

# Seconds: realtime jobs live in milliseconds, offline work in hours.
LATENCY_BUCKETS_S = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0,
    7200.0, 21600.0,
)  # fmt: skip
INFERENCE_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
BATCH_TOKEN_BUCKETS = (16, 64, 256, 1024, 4096, 16384, 65536, 262144)

QUEUE_TIME = Histogram(
    "renq_request_queue_time_seconds",
    "Time jobs waited from submission until their forward pass (or cloud call) started.",
    ["service", "tier"],
    buckets=LATENCY_BUCKETS_S,
)
E2E_LATENCY = Histogram(
    "renq_e2e_request_latency_seconds",
    "Time from submission until the job's final status was stored.",
    ["service", "tier"],
    buckets=LATENCY_BUCKETS_S,
)
BATCH_SIZE = Histogram(
    "renq_batch_size", "Jobs per forward pass.", ["service"], buckets=BATCH_SIZE_BUCKETS
)
BATCH_TOKENS = Histogram(
    "renq_batch_tokens", "Input tokens per forward pass.", ["service"], buckets=BATCH_TOKEN_BUCKETS
)
INFERENCE_TIME = Histogram(
    "renq_inference_time_seconds",
    "Duration of one batched forward pass, per model.",
    ["service", "model"],
    buckets=INFERENCE_BUCKETS_S,
)
TIME_TO_FIRST_TOKEN = Histogram(
    "renq_time_to_first_token_seconds",
    "Time from submission to the first streamed token (streaming answers only).",
    ["service"],
    buckets=LATENCY_BUCKETS_S,
)
JOBS_FINISHED = Counter(
    "renq_jobs_finished",
    "Jobs that reached a final status: succeeded, failed, expired or cancelled, and why.",
    ["service", "tier", "status", "reason"],
)
BACKEND_ATTEMPTS = Counter(
    "renq_backend_attempts",
    "Tries of a job on a backend (local GPU workers or a cloud API), by outcome.",
    ["backend", "outcome"],
)
BACKEND_COST = Counter(
    "renq_backend_cost_usd", "Spend on a backend from its token usage, in USD.", ["backend"]
)
TENANT_COST = Counter(
    "renq_tenant_cost_usd",
    "Spend per tenant and backend, in USD (RENQ_METRICS_TENANT_LABELS=true only).",
    ["tenant", "backend"],
)


def _seconds(start, end) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


# --- recording: one call per event, never raising ---------------------------------------------


def observe_batch(service: Service, outcomes: Sequence[Outcome]) -> None:
    """After a GPU batch's forward pass: its size, tokens and duration."""
    try:
        if not outcomes:
            return
        BATCH_SIZE.labels(service.name).observe(len(outcomes))
        BATCH_TOKENS.labels(service.name).observe(sum(o.tokens or 0 for o in outcomes))
        timed = [o.inference_ms for o in outcomes if o.inference_ms]
        if timed:
            INFERENCE_TIME.labels(service.name, service.model_ref).observe(max(timed) / 1000)
    except Exception:
        logger.exception("metrics: could not record a batch")


def record_outcomes(outcomes: Iterable[Outcome]) -> None:
    """Jobs stored as succeeded or failed (the state machine's store_outcomes). Each label set
    is looked up once per batch: per job, the lookups were a fifth of a no-op worker's CPU."""
    try:
        now = timezone.now()
        finished: dict[tuple[str, str, bool], int] = defaultdict(int)
        waits: dict[tuple[str, str], list[float]] = defaultdict(list)
        latencies: dict[tuple[str, str], list[float]] = defaultdict(list)
        for outcome in outcomes:
            job = outcome.job
            key = (job.service.name, job.tier)
            finished[(*key, outcome.result is not None)] += 1
            waited = _seconds(job.created_at, outcome.started_at)
            if waited is not None:
                waits[key].append(waited)
            latencies[key].append(_seconds(job.created_at, now) or 0.0)
        for (service, tier, ok), count in finished.items():
            JOBS_FINISHED.labels(
                service, tier, "succeeded" if ok else "failed", "ok" if ok else "error"
            ).inc(count)
        for key, seconds in waits.items():
            _observe_all(QUEUE_TIME.labels(*key), seconds)
        for key, seconds in latencies.items():
            _observe_all(E2E_LATENCY.labels(*key), seconds)
    except Exception:
        logger.exception("metrics: could not record outcomes")


def _observe_all(histogram, values: list[float]) -> None:
    for value in values:
        histogram.observe(value)


def record_jobs(jobs: Iterable[Job], status: str, reason: str) -> None:
    """Jobs in hand that reached a final status without an outcome (e.g. expired at claim)."""
    try:
        now = timezone.now()
        for job in jobs:
            JOBS_FINISHED.labels(job.service.name, job.tier, status, reason).inc()
            E2E_LATENCY.labels(job.service.name, job.tier).observe(
                _seconds(job.created_at, now) or 0.0
            )
    except Exception:
        logger.exception("metrics: could not record %s jobs", status)


def record_leaving(queryset, from_status: str, status: str, reason: str) -> None:
    """Before a transition of a filtered set (expire, cancel, fail): count the jobs it is about
    to move, by service and tier. One small GROUP BY; these transitions are rare."""
    try:
        rows = (
            queryset.filter(status=from_status)
            .values_list("service__name", "tier")
            .annotate(n=Count("pk"))
            .order_by()
        )
        for service, tier, n in rows:
            JOBS_FINISHED.labels(service, tier, status, reason).inc(n)
    except Exception:
        logger.exception("metrics: could not count %s jobs", status)


def observe_time_to_first_token(service_name: str, seconds: float) -> None:
    try:
        TIME_TO_FIRST_TOKEN.labels(service_name).observe(seconds)
    except Exception:
        logger.exception("metrics: could not record time to first token")


def record_attempts(sender=None, *, attempts: Sequence, **_kwargs) -> None:
    """routing.attempts.attempts_recorded: every try on every backend, with its cost."""
    try:
        for attempt in attempts:
            name = attempt.backend.name
            BACKEND_ATTEMPTS.labels(name, attempt.outcome).inc()
            if attempt.cost:
                BACKEND_COST.labels(name).inc(float(attempt.cost))
        if TENANT_LABELS:
            _record_tenant_costs(attempts)
    except Exception:
        logger.exception("metrics: could not record backend attempts")


def _record_tenant_costs(attempts: Sequence) -> None:
    from inference.models import Job

    paid = [a for a in attempts if a.cost]
    if not paid:
        return
    tenants = dict(
        Job.objects.filter(pk__in={a.job_id for a in paid}).values_list("pk", "tenant__name")
    )
    for attempt in paid:
        tenant = tenants.get(attempt.job_id, "")
        TENANT_COST.labels(tenant, attempt.backend.name).inc(float(attempt.cost))


# --- state, computed at scrape time --------------------------------------------------------------


class StateCollector:
    """Gauges read from Postgres and Redis when Prometheus scrapes."""

    # Models are imported when scraped, not with this module: the state machine (imported by
    # inference.models) imports this module to record outcomes.

    def collect(self):
        yield from self._queues()
        yield from self._backends()

    @staticmethod
    def _queues():
        from inference.jobs.status import JobStatus
        from inference.jobs.tiers import TIER_ORDER
        from inference.models import Job, Service

        depth = GaugeMetricFamily(
            "renq_queue_depth", "Jobs queued (waiting for a worker), per service and tier.",
            labels=["service", "tier"],
        )  # fmt: skip
        running = GaugeMetricFamily(
            "renq_jobs_running", "Jobs claimed by a worker now, per service.", labels=["service"]
        )
        try:
            counts = {
                (service, tier, status): n
                for service, tier, status, n in Job.objects.filter(
                    status__in=[JobStatus.QUEUED, JobStatus.RUNNING], is_bulk=False
                )
                .values_list("service__name", "tier", "status")
                .annotate(n=Count("pk"))
                .order_by()
            }
            # Every active service and tier appears, at 0 when idle: dashboards and autoscalers
            # need the series to exist.
            for service in Service.objects.filter(active=True).values_list("name", flat=True):
                for tier in TIER_ORDER:
                    queued = counts.get((service, tier.value, JobStatus.QUEUED), 0)
                    depth.add_metric([service, tier.value], queued)
                busy = sum(
                    n
                    for (name, _, status), n in counts.items()
                    if name == service and status == JobStatus.RUNNING
                )
                running.add_metric([service], busy)
        except Exception:
            logger.exception("metrics: could not count queued jobs")
        yield depth
        yield running

    @staticmethod
    def _backends():
        from renq_site.shared_redis import shared_redis
        from routing.breaker import CircuitBreaker
        from routing.limits import RateLimitTracker
        from routing.models import Backend

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


attempts_recorded.connect(record_attempts, dispatch_uid="renq-metrics-backend-attempts")


def registry(*, with_state: bool = True) -> CollectorRegistry:
    """Every process's events (plus the state now), in one registry (fresh per scrape, as
    prometheus-client's multiprocess mode requires)."""
    scrape = CollectorRegistry()
    multiprocess.MultiProcessCollector(scrape, path=METRICS_DIR)
    if with_state:
        scrape.register(StateCollector())
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
