"""The Batch API's Celery task: one step of a batch, on the control queue, re-sent every
TICK_S while the batch is active. The sweep restarts chains that stopped."""

from __future__ import annotations

from celery import shared_task

from inference.batch_api.service import (
    ADVANCE_TASK,
    TICK_S,
    advance_batch,
    schedule_advance,
    stalled_batch_ids,
)


@shared_task(name=ADVANCE_TASK)
def advance_batch_task(batch_id: str) -> bool:
    more = advance_batch(batch_id)
    if more:
        schedule_advance(batch_id, TICK_S)
    return more


def restart_stalled_batches() -> int:
    """For the sweep: a step for every active batch whose chain stopped."""
    batch_ids = stalled_batch_ids()
    for batch_id in batch_ids:
        schedule_advance(batch_id)
    return len(batch_ids)
