"""The submit service: the one way a job enters renq (REST API, bulk, demo, tests)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from django.db import transaction
from django.utils import timezone

from inference.admission import check_queue_capacity, check_rate_limit
from inference.inputs import InputError
from inference.kinds import validate_input
from inference.models import Job, JobStatus, Service, Tenant
from inference.placement import route_on_submit
from inference.publishing import publish_on_commit
from inference.tiers import Tier


def resolve_service(name: Any) -> Service:
    if not isinstance(name, str) or not name:
        raise InputError("service", "is required and must be a service name.")
    try:
        return Service.objects.get(name=name, active=True)
    except Service.DoesNotExist:
        known = ", ".join(Service.objects.filter(active=True).values_list("name", flat=True))
        raise InputError("service", f"unknown service '{name}'; known: {known}.") from None


def resolve_tier(priority: Any, tenant: Tenant) -> Tier:
    if priority is None or priority == "":
        return Tier(tenant.default_tier)
    if priority not in Tier.values:
        raise InputError("priority", f"must be one of {', '.join(Tier.values)}.")
    return Tier(priority)


def input_digest(service: Service, payload: dict) -> str:
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(f"{service.pk}:{canonical}".encode()).hexdigest()


def submit_job(*, tenant: Tenant, service_name: Any, payload: Any, priority: Any = None) -> Job:
    """Validate, admit and store a job; its dispatch message is published after commit.

    Raises InputError (400, names the field) or AdmissionRefused (429/503 with Retry-After).
    """
    service = resolve_service(service_name)
    tier = resolve_tier(priority, tenant)
    clean = validate_input(service.kind, payload, max_items=service.max_items_per_job)
    check_rate_limit(tenant, service)
    digest = input_digest(service, clean)

    if service.enable_cache:
        hit = (
            Job.objects.filter(service=service, input_hash=digest, status=JobStatus.SUCCEEDED)
            .only("result")
            .first()
        )
        if hit is not None:
            now = timezone.now()
            return Job.objects.create(
                tenant=tenant,
                service=service,
                tier=tier,
                message_priority=tenant.plan_boost,
                status=JobStatus.SUCCEEDED,
                input=clean,
                input_hash=digest,
                result=hit.result,
                cached=True,
                created_at=now,
                started_at=now,
                finished_at=now,
                inference_ms=0.0,
            )

    check_queue_capacity(service)
    with transaction.atomic():
        job = Job.objects.create(
            tenant=tenant,
            service=service,
            tier=tier,
            message_priority=tenant.plan_boost,
            input=clean,
            input_hash=digest,
        )
        # A service with a route gets a backend chosen; the publish goes where it says.
        route_on_submit(job)
        publish_on_commit(job)
    return job


def cancel_job(job: Job) -> bool:
    """Cancel a queued job. Returns False if a worker already claimed or finished it."""
    cancelled = Job.objects.filter(pk=job.pk).cancel()
    job.refresh_from_db()
    return bool(cancelled)
