"""Celery task for the I/O workers: a thread pool with high concurrency consuming the
`io.<tier>` queues, so a slow API never holds a GPU worker."""

from __future__ import annotations

from celery import shared_task

from routing.calls import run_cloud_attempt


@shared_task(name="routing.call_backend", bind=True)
def call_backend(self, job_id: str, backend_id: int) -> dict:
    info = self.request.delivery_info or {}
    return run_cloud_attempt(job_id, backend_id, redelivered=bool(info.get("redelivered")))
