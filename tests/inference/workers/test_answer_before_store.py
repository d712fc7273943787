"""A realtime or api success is announced before its row is stored, then again once stored;
what a client was told before the store is what a read of the job gives, and what its row
ends with should the worker die before storing it."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import psycopg2
import pytest
from django.db import connection
from django.utils import timezone
from rest_framework.test import APIClient

from inference.delivery.waiting import (
    Notice,
    answer_before_store,
    answered_job,
    job_channel,
    kept_answer_key,
)
from inference.engines.noop import NoopEngine
from inference.jobs.transitions import Outcome
from inference.models import Job, JobStatus
from inference.scheduling.cost_model import BatchCostModel
from inference.workers.gpu.held import Held
from inference.workers.gpu.ledger import MessageLedger
from inference.workers.gpu.report import BatchReport
from inference.workers.gpu.store_thread import OutcomeWriter
from inference.workers.sweeper import take_over_lapsed_leases
from renq_site.shared_redis import shared_redis

pytestmark = pytest.mark.django_db(transaction=True)


def _notifications(pubsub, timeout_s: float = 0.5) -> list[bytes]:
    heard = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        message = pubsub.get_message(ignore_subscribe_messages=True, timeout=0.1)
        if message is not None:
            heard.append(message["data"])
    return heard


def _stored_while_heard(tier: str, make_tenant, make_service) -> tuple[list[bytes], Job]:
    tenant, _ = make_tenant()
    service = make_service("noop", name=f"answer-{tier}")
    job = Job.objects.create(tenant=tenant, service=service, tier=tier, input={"texts": ["x"]})
    claim = Job.objects.claim([job.pk], worker="w")
    pubsub = shared_redis().pubsub()
    pubsub.subscribe(job_channel(job.pk))
    pubsub.get_message(timeout=2)  # the subscription's confirmation
    writer = OutcomeWriter(
        NoopEngine("none"),
        BatchCostModel(service.name, "cpu"),
        ledger=MessageLedger(None, service.name),
        report=BatchReport(),
    )
    try:
        outcome = Outcome(job=claim.jobs[0], result={"count": 1}, batch_size=1, tokens=1)
        writer.write([Held(claim.jobs[0], claim)], [outcome], service)
        writer.written()  # the store thread's write is done
        return _notifications(pubsub), Job.objects.get(pk=job.pk)
    finally:
        pubsub.close()


@pytest.mark.parametrize("tier", ["realtime", "api"])
def test_an_interactive_success_is_announced_before_and_after_its_store(
    make_tenant, make_service, tier
):
    heard, job = _stored_while_heard(tier, make_tenant, make_service)
    notices = [Notice.decode(data) for data in heard]
    assert [(n.stored, n.result) for n in notices] == [(False, {"count": 1}), (True, {"count": 1})]
    assert (job.status, job.result) == (JobStatus.SUCCEEDED, {"count": 1})


def test_a_batch_success_is_announced_once_stored(make_tenant, make_service):
    heard, job = _stored_while_heard("batch", make_tenant, make_service)
    assert [Notice.decode(data).stored for data in heard] == [True]
    assert job.status == JobStatus.SUCCEEDED


def test_a_pass_is_answered_while_the_previous_batch_is_still_being_stored(
    make_tenant, make_service
):
    """The drain loop announces a pass's answers before it waits for the previous batch's
    store: a client is not held up by another batch's rows."""
    tenant, _ = make_tenant()
    service = make_service("noop", name="answer-while-storing")
    first, second = (
        Job.objects.create(tenant=tenant, service=service, tier="realtime", input={"texts": [t]})
        for t in ("a", "b")
    )
    claim = Job.objects.claim([first.pk, second.pk], worker="w")
    held = {job.pk: Held(job, claim) for job in claim.jobs}
    writer = OutcomeWriter(
        NoopEngine("none"),
        BatchCostModel(service.name, "cpu"),
        ledger=MessageLedger(None, service.name),
        report=BatchReport(),
    )
    # Another session holds the first job's row: its store waits until that one commits.
    blocker = psycopg2.connect(
        dbname=connection.settings_dict["NAME"],
        **{k: connection.settings_dict[v] for k, v in (("host", "HOST"), ("user", "USER"))},
        port=connection.settings_dict["PORT"] or 5432,
    )
    pubsub = shared_redis().pubsub()
    pubsub.subscribe(job_channel(second.pk))
    pubsub.get_message(timeout=2)
    try:
        blocker.cursor().execute(
            "SELECT 1 FROM inference_job WHERE id = %s FOR UPDATE", [str(first.pk)]
        )
        one = Outcome(job=held[first.pk].job, result={"n": 1}, batch_size=1, tokens=1)
        writer.write([held[first.pk]], [one], service)
        two = Outcome(job=held[second.pk].job, result={"n": 2}, batch_size=1, tokens=1)
        announcing = threading.Thread(
            target=writer.announce, args=([held[second.pk]], [two], service)
        )
        announcing.start()
        announcing.join(timeout=5)
        assert not announcing.is_alive(), "the answer waited for the other batch's store"
        heard = [Notice.decode(data) for data in _notifications(pubsub)]
        assert [(n.stored, n.result) for n in heard] == [(False, {"n": 2})]
        assert Job.objects.get(pk=first.pk).status == JobStatus.RUNNING  # still being stored
        blocker.rollback()
        writer.write([held[second.pk]], [two], service, announced=[(held[second.pk], two)])
        writer.written()
        # Announced once before its store, then once stored: never twice unstored.
        assert [Notice.decode(d).stored for d in _notifications(pubsub)] == [True]
        assert Job.objects.get(pk=second.pk).status == JobStatus.SUCCEEDED
    finally:
        blocker.close()
        pubsub.close()


def test_an_answer_whose_worker_died_before_its_store_is_what_the_row_ends_with(
    make_tenant, make_service
):
    tenant, key = make_tenant()
    service = make_service("noop", name="answered-then-lost")
    job = Job.objects.create(
        tenant=tenant, service=service, tier="realtime", input={"texts": ["x"]}
    )
    claim = Job.objects.claim([job.pk], worker="lost-host:1")
    vectors = {"embeddings": [[0.25, -1.0]], "dim": 2}
    answer_before_store(
        [Outcome(job=claim.jobs[0], result=vectors, inference_ms=2.0, batch_size=1, tokens=3)]
    )
    # The worker dies here. Until its lease lapses, a read gives what the client was told.
    api_client = APIClient()
    api_client.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    read = api_client.get(f"/api/v1/jobs/{job.pk}").json()
    assert (read["status"], read["result"]["embeddings"]) == ("succeeded", [[0.25, -1.0]])
    # The list shows it as its own page does.
    listed = api_client.get("/api/v1/jobs").json()["results"]
    assert [(j["id"], j["status"]) for j in listed] == [(str(job.pk), "succeeded")]

    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    take_over_lapsed_leases()
    stored = Job.objects.get(pk=job.pk)
    assert (stored.status, stored.input_tokens, stored.batch_size) == ("succeeded", 3, 1)
    assert answered_job(stored).result_vectors == stored.result_vectors
    assert read["result"] == api_client.get(f"/api/v1/jobs/{job.pk}").json()["result"]
    # Its store's notice forgot the kept answer.
    assert not shared_redis().exists(kept_answer_key(job.pk))


def test_a_stored_answer_is_no_longer_kept(make_tenant, make_service):
    heard, job = _stored_while_heard("realtime", make_tenant, make_service)
    assert [Notice.decode(data).stored for data in heard] == [False, True]
    assert not shared_redis().exists(kept_answer_key(job.pk))
