"""`extra=` for log calls about a job: `logger.info("…", extra=job_fields(job, batch_id=…))`,
so JSON logs (renq_site.log_format) carry the job id, tenant, service, tier and backend."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference.models import Job


def job_fields(job: Job, **more: Any) -> dict[str, Any]:
    fields = {
        "job_id": job.pk,
        "tenant": getattr(job.tenant, "name", job.tenant_id),
        "service": getattr(job.service, "name", job.service_id),
        "tier": job.tier,
    }
    fields.update({key: value for key, value in more.items() if value is not None})
    return fields
