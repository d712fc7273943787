"""The audit trail: one append-only row per job receipt, completion, cancellation and dead
letter, and per admin change (`AuditEvent`). Completions are written by the state machine in
the same statement batch as the outcomes; everything else through these functions."""

from __future__ import annotations

from collections.abc import Sequence

from django.contrib.admin.models import LogEntry
from django.db.models.signals import post_save
from django.dispatch import receiver

from inference.intake.row_writer import insert_new_rows
from inference.models import AuditEvent, AuditEventKind, Job


def receipts(jobs: Sequence[Job], *, actor: str) -> list[AuditEvent]:
    """One row per accepted job, not saved yet (the submit path inserts them with the jobs)."""
    return [
        AuditEvent(
            at=job.created_at,
            kind=AuditEventKind.RECEIVED,
            tenant_id=job.tenant_id,
            job_id=job.pk,
            actor=actor[:200],
            detail={"service": job.service.name, "tier": job.tier},
        )
        for job in jobs
    ]


def record_receipts(jobs: Sequence[Job], *, actor: str) -> None:
    """One row per accepted job, in one INSERT."""
    insert_new_rows(receipts(jobs, actor=actor))


def record_event(kind: str, *, job: Job | None = None, actor: str, detail: dict | None = None):
    return AuditEvent.objects.create(
        kind=kind,
        tenant_id=job.tenant_id if job is not None else None,
        job_id=job.pk if job is not None else None,
        actor=actor[:200],
        detail=detail or {},
    )


@receiver(post_save, sender=LogEntry)
def _audit_admin_change(sender, instance: LogEntry, created: bool, **_kwargs) -> None:
    """Every change made in the admin (Django logs each one as a LogEntry)."""
    if not created:
        return
    AuditEvent.objects.create(
        kind=AuditEventKind.ADMIN_CHANGE,
        actor=f"admin:{instance.user}"[:200],
        detail={
            "object": f"{instance.content_type.app_label}.{instance.content_type.model}"
            if instance.content_type_id
            else "",
            "object_id": instance.object_id,
            "repr": instance.object_repr,
            "action": {1: "added", 2: "changed", 3: "deleted"}.get(instance.action_flag, ""),
            "message": instance.get_change_message(),
        },
    )
