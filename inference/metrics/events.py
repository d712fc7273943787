"""Prometheus metrics recorded where things happen, named the way vLLM (`vllm:*`) and TEI
(`te_*`) name theirs, with `renq_`. Each process writes its own file under
PROMETHEUS_MULTIPROC_DIR (default .run/prometheus); the scrape (inference.metrics.collector)
sums them.

    renq_request_queue_time_seconds{service,tier}   submission → forward pass started
    renq_e2e_request_latency_seconds{service,tier}  submission → final status stored
    renq_batch_size{service}, renq_batch_tokens{service}   per forward pass
    renq_inference_time_seconds{service,model}      per forward pass (batch)
    renq_time_to_first_token_seconds{service}       streaming answers
    renq_jobs_finished_total{service,tier,status,reason}
    renq_backend_attempts_total{backend,outcome}, renq_backend_cost_usd_total{backend}
    renq_tenant_cost_usd_total{tenant,backend}      only with RENQ_METRICS_TENANT_LABELS=true
    renq_tenant_class_queue_time_seconds{service,tier,plan}   queue time per tenant plan
    renq_tenant_class_served_tokens_total{service,tier,plan}  input tokens of succeeded jobs
    renq_tenant_class_served_jobs_total{service,tier,plan}    succeeded jobs
    renq_tenant_queue_time_seconds{service,tier,tenant}, renq_tenant_served_tokens_total{...}
                                                    per tenant, RENQ_METRICS_TENANT_LABELS=true
    renq_admission_refused_total{status,quota}      requests refused with Retry-After

This module imports no models: the state machine's signals reach it through
inference.metrics.receivers. Every recording function catches and logs its own errors: a
metric must never fail a batch or a job.
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from django.conf import settings
from django.utils import timezone

# Multiprocess mode must be chosen before the first metric exists: set the directory, then make
# sure prometheus-client's value class uses it even if a library imported it first.
METRICS_DIR = os.environ.setdefault(
    "PROMETHEUS_MULTIPROC_DIR", str(Path(settings.BASE_DIR) / ".run" / "prometheus")
)
Path(METRICS_DIR).mkdir(parents=True, exist_ok=True)

from prometheus_client import Counter, Histogram, values  # noqa: E402

if not getattr(values.ValueClass, "_multiprocess", False):
    values.ValueClass = values.get_value_class()

if TYPE_CHECKING:
    from inference.jobs.transitions import Outcome
    from inference.models import Job, Service
    from routing.models import JobAttempt

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
ADMISSION_REFUSED = Counter(
    "renq_admission_refused",
    "Requests refused at admission with Retry-After (429 or 503), by the limit that refused "
    "them (rate_limit, max_queue_size, overdue, broker, ...).",
    ["status", "quota"],
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

# Per tenant class (plan): bounded labels, always on. What fairness between tenants looks like
# from outside; the index itself is computed at scrape time (inference.metrics.collector).
TENANT_CLASS_QUEUE_TIME = Histogram(
    "renq_tenant_class_queue_time_seconds",
    "Time jobs waited from submission until their forward pass started, per tenant plan.",
    ["service", "tier", "plan"],
    buckets=LATENCY_BUCKETS_S,
)
TENANT_CLASS_SERVED_TOKENS = Counter(
    "renq_tenant_class_served_tokens",
    "Input tokens of jobs stored as succeeded, per tenant plan.",
    ["service", "tier", "plan"],
)
TENANT_CLASS_SERVED_JOBS = Counter(
    "renq_tenant_class_served_jobs",
    "Jobs stored as succeeded, per tenant plan.",
    ["service", "tier", "plan"],
)
TENANT_QUEUE_TIME = Histogram(
    "renq_tenant_queue_time_seconds",
    "Time jobs waited until their forward pass, per tenant (RENQ_METRICS_TENANT_LABELS=true).",
    ["service", "tier", "tenant"],
    buckets=LATENCY_BUCKETS_S,
)
TENANT_SERVED_TOKENS = Counter(
    "renq_tenant_served_tokens",
    "Input tokens of jobs stored as succeeded, per tenant (RENQ_METRICS_TENANT_LABELS=true).",
    ["service", "tier", "tenant"],
)


def _seconds(start, end) -> float | None:
    if start is None or end is None:
        return None
    return max(0.0, (end - start).total_seconds())


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


def record_outcomes(
    outcomes: Iterable[Outcome], tenants: Mapping[int, tuple[str, str]] | None = None
) -> None:
    """Jobs stored as succeeded or failed; `tenants` (tenant id → (plan, name)) adds the per
    plan (and, opted in, per tenant) series. Each label set is looked up once per batch, not
    per job: the lookup costs more than the observation."""
    try:
        now = timezone.now()
        finished: dict[tuple[str, str, bool], int] = defaultdict(int)
        waits: dict[tuple[str, str], list[float]] = defaultdict(list)
        latencies: dict[tuple[str, str], list[float]] = defaultdict(list)
        # Keyed (service, tier, plan or tenant name).
        class_waits: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        class_served: dict[tuple[str, str, str], list[int]] = defaultdict(lambda: [0, 0])
        tenant_waits: dict[tuple[str, str, str], list[float]] = defaultdict(list)
        tenant_tokens: dict[tuple[str, str, str], int] = defaultdict(int)
        for outcome in outcomes:
            job = outcome.job
            key = (job.service.name, job.tier)
            ok = outcome.result is not None
            finished[(*key, ok)] += 1
            waited = _seconds(job.created_at, outcome.started_at)
            if waited is not None:
                waits[key].append(waited)
            latencies[key].append(_seconds(job.created_at, now) or 0.0)
            tenant = tenants.get(job.tenant_id) if tenants else None
            if tenant is None:
                continue
            plan, name = tenant
            if waited is not None:
                class_waits[(*key, plan)].append(waited)
                if TENANT_LABELS:
                    tenant_waits[(*key, name)].append(waited)
            if ok:
                served = class_served[(*key, plan)]
                served[0] += outcome.tokens or 0
                served[1] += 1
                if TENANT_LABELS:
                    tenant_tokens[(*key, name)] += outcome.tokens or 0
        for (service, tier, ok), count in finished.items():
            JOBS_FINISHED.labels(
                service, tier, "succeeded" if ok else "failed", "ok" if ok else "error"
            ).inc(count)
        for key, seconds in waits.items():
            _observe_all(QUEUE_TIME.labels(*key), seconds)
        for key, seconds in latencies.items():
            _observe_all(E2E_LATENCY.labels(*key), seconds)
        for key, seconds in class_waits.items():
            _observe_all(TENANT_CLASS_QUEUE_TIME.labels(*key), seconds)
        for key, (tokens, jobs) in class_served.items():
            TENANT_CLASS_SERVED_TOKENS.labels(*key).inc(tokens)
            TENANT_CLASS_SERVED_JOBS.labels(*key).inc(jobs)
        for key, seconds in tenant_waits.items():
            _observe_all(TENANT_QUEUE_TIME.labels(*key), seconds)
        for key, tokens in tenant_tokens.items():
            TENANT_SERVED_TOKENS.labels(*key).inc(tokens)
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


def record_leaving(counts: Iterable[tuple[str, str, int]], status: str, reason: str) -> None:
    """Jobs a filtered move (expire, cancel, fail) is taking to `status`: (service, tier, n)."""
    try:
        for service, tier, n in counts:
            JOBS_FINISHED.labels(service, tier, status, reason).inc(n)
    except Exception:
        logger.exception("metrics: could not count %s jobs", status)


def observe_admission_refused(status: int, quota: str) -> None:
    try:
        ADMISSION_REFUSED.labels(str(status), quota or "other").inc()
    except Exception:
        logger.exception("metrics: could not record a refusal")


def observe_time_to_first_token(service_name: str, seconds: float) -> None:
    try:
        TIME_TO_FIRST_TOKEN.labels(service_name).observe(seconds)
    except Exception:
        logger.exception("metrics: could not record time to first token")


def record_attempts(attempts: Sequence[JobAttempt], tenants: dict | None = None) -> None:
    """Every try on every backend, with its cost; `tenants` (job id → tenant name) adds the
    per-tenant cost series."""
    try:
        for attempt in attempts:
            name = attempt.backend.name
            BACKEND_ATTEMPTS.labels(name, attempt.outcome).inc()
            if attempt.cost:
                BACKEND_COST.labels(name).inc(float(attempt.cost))
                if tenants is not None:
                    tenant = tenants.get(attempt.job_id, "")
                    TENANT_COST.labels(tenant, name).inc(float(attempt.cost))
    except Exception:
        logger.exception("metrics: could not record backend attempts")
