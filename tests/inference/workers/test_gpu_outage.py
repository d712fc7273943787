"""A message the batch runner pulled goes back to its queue when PostgreSQL fails before the
claim: found by the chaos suite (tests/chaos, PostgreSQL cut), where such a job waited for the
lost-message sweep (30 s) because its message stayed unacked on the reader's live channel."""

from __future__ import annotations

import uuid

import pytest
from django.db import OperationalError

from inference.engines.noop import NoopEngine
from inference.models import Job
from inference.tiers import Tier
from inference.workers.gpu import BatchReport, BatchRunner, _Drain
from inference.workers.tier_reader import DEFAULT_WEIGHTS, PulledMessage, WeightedShare


class FakeMessage:
    def __init__(self):
        self.delivery_info = {}
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
    drain = _Drain(
        BatchRunner(readers=None),
        service,
        NoopEngine("none"),
        FakeReader([pulled]),
        "worker",
        BatchReport(),
    )

    def database_gone(*_args, **_kwargs):
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(Job.objects, "claim", database_gone)
    with pytest.raises(OperationalError):
        drain.fill(drain.new_window(), only_realtime=False, may_pull=True)
    assert message.requeued, "the message would stay unacked on the reader's channel"
