"""The metrics' receivers: the state machine's signals (inference.jobs.signals) and routing's
`attempts_recorded`, turned into the events of inference.metrics.events."""

from __future__ import annotations

import logging

from django.db.models import Count

from inference.jobs import signals
from inference.metrics import events
from inference.models import Job, Tenant
from routing.attempts import attempts_recorded

logger = logging.getLogger(__name__)


def on_outcomes_stored(sender, *, outcomes, **_kwargs) -> None:
    events.record_outcomes(outcomes, _plans_and_names(outcomes))


def _plans_and_names(outcomes) -> dict[int, tuple[str, str]] | None:
    """Tenant id → (plan, name) for the outcomes' jobs: from the tenants the claim attached,
    else one query for the whole batch (never one per job)."""
    try:
        tenants: dict[int, tuple[str, str]] = {}
        missing = set()
        for outcome in outcomes:
            job = outcome.job
            if Job.tenant.is_cached(job):
                tenants[job.tenant_id] = (job.tenant.plan, job.tenant.name)
            else:
                missing.add(job.tenant_id)
        missing -= tenants.keys()
        if missing:
            for pk, plan, name in Tenant.objects.filter(pk__in=missing).values_list(
                "pk", "plan", "name"
            ):
                tenants[pk] = (plan, name)
        return tenants
    except Exception:
        logger.exception("metrics: could not look up the tenants of stored outcomes")
        return None


def on_jobs_ended(sender, *, jobs, status: str, reason: str, **_kwargs) -> None:
    events.record_jobs(jobs, status, reason)


def on_jobs_leaving(sender, *, queryset, from_status: str, status: str, reason: str, **_kw) -> None:
    """One small GROUP BY before the move; these moves are rare."""
    try:
        counts = list(
            queryset.filter(status=from_status)
            .values_list("service__name", "tier")
            .annotate(n=Count("pk"))
            .order_by()
        )
    except Exception:
        logger.exception("metrics: could not count %s jobs", status)
        return
    events.record_leaving(counts, status, reason)


def on_attempts_recorded(sender, *, attempts, **_kwargs) -> None:
    tenants = None
    if events.TENANT_LABELS and any(a.cost for a in attempts):
        try:
            tenants = dict(
                Job.objects.filter(pk__in={a.job_id for a in attempts if a.cost}).values_list(
                    "pk", "tenant__name"
                )
            )
        except Exception:
            logger.exception("metrics: could not look up the tenants of paid attempts")
    events.record_attempts(attempts, tenants)


def connect() -> None:
    signals.outcomes_stored.connect(on_outcomes_stored, dispatch_uid="renq-metrics-outcomes")
    signals.jobs_ended.connect(on_jobs_ended, dispatch_uid="renq-metrics-ended")
    signals.jobs_leaving.connect(on_jobs_leaving, dispatch_uid="renq-metrics-leaving")
    attempts_recorded.connect(on_attempts_recorded, dispatch_uid="renq-metrics-attempts")
