"""The baseline for `make bench`: plain Celery, one task per job, no batching, same model,
same kind of worker, same Postgres record of the result."""

from __future__ import annotations

import functools
import time

from celery import shared_task
from django.utils import timezone

from inference.engines import load_engine
from inference.jobs.vectors import split_result
from inference.models import Job, JobStatus
from inference.workers.cpu_pinning import pin_model_thread

# The model's cores, as renq's forward passes get them (RENQ_MODEL_CPUS): here the task's own
# thread runs the model, so its bookkeeping runs there too.
_pin_once = functools.cache(pin_model_thread)


@shared_task(name="bench.plain_embed", acks_late=True)
def plain_embed(job_id: str) -> None:
    _pin_once()
    job = Job.objects.select_related("service").get(pk=job_id)
    engine = load_engine(job.service.kind, job.service.model_ref)
    started_at = timezone.now()
    t0 = time.perf_counter()
    result, vectors = split_result(engine.run_batch([job.input])[0])
    Job.objects.filter(pk=job_id).update(
        status=JobStatus.SUCCEEDED,
        result=result,
        result_vectors=vectors,
        started_at=started_at,
        finished_at=timezone.now(),
        inference_ms=(time.perf_counter() - t0) * 1000,
        batch_size=1,
    )
