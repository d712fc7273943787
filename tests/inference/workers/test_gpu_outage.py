"""A message the batch runner pulled goes back to its queue when PostgreSQL fails before the
claim: found by the chaos suite (tests/chaos, PostgreSQL cut), where such a job waited for the
lost-message sweep (30 s) because its message stayed unacked on the reader's live channel."""

from __future__ import annotations

import uuid

import pytest
from django.db import OperationalError

from inference.engines.noop import NoopEngine
from inference.jobs.tiers import Tier
from inference.models import Job
from inference.workers.gpu.held import Held
from inference.workers.gpu.loop import DrainLoop
from inference.workers.gpu.model_thread import ModelThread
from inference.workers.gpu.report import BatchReport
from inference.workers.tier_reader import DEFAULT_WEIGHTS, PulledMessage, WeightedShare


class FakeMessage:
    def __init__(self):
        self.delivery_info = {}
        self.headers = {}
        self.acknowledged = False
        self.requeued = False

    def ack(self):
        self.acknowledged = True

    def requeue(self):
        self.acknowledged = self.requeued = True


class FakeReader:
    def __init__(self, messages):
        self.messages = list(messages)
        self.share = WeightedShare(DEFAULT_WEIGHTS)

    def get(self, tiers=None):
        return self.messages.pop(0) if self.messages else None


@pytest.mark.django_db
def test_a_pulled_message_goes_back_when_the_claim_fails(make_service, monkeypatch):
    service = make_service("noop")
    message = FakeMessage()
    pulled = PulledMessage(job_ids=[str(uuid.uuid4())], tier=Tier.API, message=message)
    drain = DrainLoop(
        service,
        NoopEngine("none"),
        FakeReader([pulled]),
        readers=None,
        model_thread=ModelThread(),
        worker="worker",
        report=BatchReport(),
    )

    def database_gone(*_args, **_kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(Job.objects, "claim", database_gone)
    with pytest.raises(OperationalError):
        drain.former.fill(drain.former.new_window(), only_realtime=False, may_pull=True)
    assert message.requeued, "the message would stay unacked on the reader's channel"


class BrokenReader(FakeReader):
    """A reader whose broker connection died (a RabbitMQ restart since its last batch)."""

    def get(self, tiers=None):
        raise ConnectionResetError(104, "Connection reset by peer")


@pytest.mark.django_db(transaction=True)  # the loop stores outcomes on its own connection
def test_a_claimed_job_still_runs_when_the_reader_broke_while_forming(make_service, make_tenant):
    # After a RabbitMQ restart the first task's reader is dead. Its seed, a batch-tier job,
    # waits for its tier's turn; the failed pull dropped it with the window, and the task
    # returned with the job claimed: stuck running until the stale-claim sweep (120 s).
    service = make_service("noop", name="broken-reader")
    tenant, _ = make_tenant()
    job = Job.objects.create(tenant=tenant, service=service, tier="batch", input={"texts": ["x"]})
    claim = Job.objects.claim([job.pk], worker="test")
    discarded = []
    loop = DrainLoop(
        service,
        NoopEngine("none"),
        BrokenReader([]),
        readers=type("Readers", (), {"discard": discarded.append})(),
        model_thread=ModelThread(),
        worker="test",
        report=BatchReport(),
    )
    loop.hold(Held(claim.jobs[0], claim), Tier.BATCH)

    loop.run()

    job.refresh_from_db()
    assert job.status == "succeeded"
    assert loop.report.ran == 1
    assert discarded == ["broken-reader"]  # the next task opens a fresh connection
