"""A realtime job whose head start an idle worker took is handed over to that worker once
committed (no message), when its tenant has no work ahead; otherwise it is published as any
job, and the worker's pass waits for the message."""

from __future__ import annotations

import uuid

import pytest

from inference.config.models import PlanPolicy
from inference.dispatch import fair_share, handover
from inference.dispatch.broker import ready_message_counts
from inference.dispatch.queues import MAX_PRIORITY, service_queues, tier_queue
from inference.intake.submission import submit_job
from inference.models import Job, JobStatus
from renq_site.shared_redis import shared_redis
from tests.conftest import purge_test_queues

pytestmark = [pytest.mark.django_db(transaction=True)]


@pytest.fixture
def offered(make_tenant, make_service):
    """Submit a realtime job of the service `handed` as a front door does after offering its
    head start (its id chosen first); returns the job's id, the queue and the tenant."""
    make_service("noop", name="handed")
    purge_test_queues(service_queues("handed"))
    tenant, _ = make_tenant()
    queue = tier_queue("handed", "realtime")

    def submit(job_id: uuid.UUID) -> Job:
        return submit_job(
            tenant=tenant,
            service_name="handed",
            payload={"texts": ["hello"]},
            priority="realtime",
            job_id=job_id,
            head_start_offered=True,
        )

    return submit, queue, tenant


def test_a_taken_head_start_is_handed_over_with_no_message_and_its_turn_taken(offered):
    submit, queue, _ = offered
    client = shared_redis()
    for _ in range(2):
        job_id = uuid.uuid4()
        assert handover.take(client, str(job_id))

        submit(job_id)

        assert handover.await_answer(client, str(job_id), timeout_s=1)
        job = Job.objects.get(pk=job_id)
        # Committed, with published_at set: the outbox does not send it; its taker claims it.
        assert job.status == JobStatus.QUEUED and job.published_at is not None
    assert ready_message_counts([queue]) == {queue: 0}
    # Each was charged and taken at once: the second started where the first's charge ended.
    assert fair_share.clock(queue).virtual_time > 0


def test_a_head_start_nobody_took_is_published_and_not_taken_later(offered):
    submit, queue, _ = offered
    job_id = uuid.uuid4()

    submit(job_id)

    assert ready_message_counts([queue]) == {queue: 1}
    assert not handover.take(shared_redis(), str(job_id))


def test_a_tenant_with_work_ahead_gets_its_message_and_the_taker_is_told_no(offered):
    submit, queue, tenant = offered
    # The tenant's earlier work: its finish tag lies far past the queue's virtual time.
    fair_share.tag_messages(
        [
            fair_share.Charge(
                queue=queue, tenant_id=tenant.pk, tokens=1_000_000, jobs=1, weight=1.0,
                batch_jobs=32, batch_tokens=8192,
            )
        ],
        top=MAX_PRIORITY,
    )  # fmt: skip
    client = shared_redis()
    job_id = uuid.uuid4()
    assert handover.take(client, str(job_id))

    submit(job_id)

    assert not handover.await_answer(client, str(job_id), timeout_s=1)
    assert ready_message_counts([queue]) == {queue: 1}


def test_a_taker_that_waited_in_vain_leaves_the_job_to_its_message(offered):
    submit, queue, _ = offered
    client = shared_redis()
    job_id = uuid.uuid4()
    assert handover.take(client, str(job_id))
    assert not handover.await_answer(client, str(job_id), timeout_s=0.05)

    submit(job_id)  # its commit comes after the worker gave up

    assert ready_message_counts([queue]) == {queue: 1}
    assert client.get(handover.mark_key(str(job_id))) == b"abandoned"


def test_a_job_served_below_realtime_is_published_and_the_taker_told_no(offered):
    submit, _, _ = offered
    # Past its plan's realtime cap the job is served as api: it waits in the api queue.
    PlanPolicy.objects.create(plan="pro", tier_boost=0, weight=1.0, realtime_cap=0)
    client = shared_redis()
    job_id = uuid.uuid4()
    assert handover.take(client, str(job_id))

    job = submit(job_id)

    assert job.tier == "api"
    assert not handover.await_answer(client, str(job_id), timeout_s=1)
    assert client.get(handover.mark_key(str(job_id))) == b"no"  # told, not left to time out
    api_queue = tier_queue("handed", "api")
    assert ready_message_counts([api_queue]) == {api_queue: 1}


def test_a_plain_realtime_submission_hands_over_the_head_start_taken_before_its_commit(
    offered, monkeypatch
):
    """A REST POST that does not wait offers its job just before the commit: a worker that
    takes it is answered as a front door's taker is."""
    from inference.dispatch.head_start import take_offer
    from inference.intake import submission

    _, queue, tenant = offered
    client = shared_redis()
    offer_then_take = submission.offer_head_start

    def offered_and_taken(job: Job) -> bool:
        made = offer_then_take(job)
        offer = take_offer(client, [queue], timeout_s=1)  # an idle worker, before the commit
        assert made and offer is not None and offer.answered
        assert handover.take(client, offer.job_id)
        return made

    monkeypatch.setattr(submission, "offer_head_start", offered_and_taken)
    job = submit_job(
        tenant=tenant, service_name="handed", payload={"texts": ["hi"]}, priority="realtime"
    )

    assert handover.await_answer(client, str(job.pk), timeout_s=1)
    assert ready_message_counts([queue]) == {queue: 0}
    assert Job.objects.get(pk=job.pk).status == JobStatus.QUEUED  # its taker claims it
