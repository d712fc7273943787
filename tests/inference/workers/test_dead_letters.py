"""A job whose input breaks the model is dead-lettered; its neighbours and the worker carry on."""

from __future__ import annotations

import pytest

from inference.dispatch.broker import ready_message_counts
from inference.dispatch.queues import dead_letter_queue
from inference.engines.noop import POISON_TEXT
from inference.intake.submission import requeue_dead_lettered, submit_job
from inference.models import AuditEvent, Job, JobStatus
from renq_site.celery import app
from tests.conftest import wait_for_job

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.worker]


def _dead_letters_waiting() -> int:
    with app.connection_for_write() as conn:
        app.amqp.queues[dead_letter_queue()](conn.channel()).declare()
    return ready_message_counts([dead_letter_queue()])[dead_letter_queue()]


def test_a_poison_job_among_good_ones_is_dead_lettered(
    celery_worker_process, make_tenant, make_service
):
    make_service("noop", batch_size=8)
    tenant, _ = make_tenant()
    before = _dead_letters_waiting()
    jobs = [
        submit_job(tenant=tenant, service_name="noop", payload={"texts": [f"good {i}"]})
        for i in range(10)
    ]
    poison = submit_job(tenant=tenant, service_name="noop", payload={"texts": [POISON_TEXT]})
    jobs += [
        submit_job(tenant=tenant, service_name="noop", payload={"texts": [f"good {i}"]})
        for i in range(10, 20)
    ]
    for job in jobs:
        assert wait_for_job(job.pk).status == JobStatus.SUCCEEDED
    poison = wait_for_job(poison.pk)
    assert poison.status == JobStatus.FAILED and poison.dead_lettered_at is not None
    assert "poison" in poison.error
    assert _dead_letters_waiting() == before + 1
    assert AuditEvent.objects.filter(job_id=poison.pk, kind="completed").exists()

    # An operator sends it back (the admin's "requeue" action): it runs again, from scratch.
    assert requeue_dead_lettered(Job.objects.filter(pk=poison.pk), actor="admin:test") == 1
    again = wait_for_job(poison.pk)
    assert again.attempts == 1 and again.dead_lettered_at is not None
