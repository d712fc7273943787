"""A run that fails while pulling hands back what it already pulled."""

from __future__ import annotations

import time

import pytest

from inference.jobs.tiers import Tier
from inference.workers.gpu.intake import Intake
from inference.workers.gpu.ledger import MessageLedger
from inference.workers.gpu.line import Line
from inference.workers.gpu.report import BatchReport
from inference.workers.tier_reader import PulledMessage, WeightedShare


class Message:
    acknowledged = False
    delivery_info: dict = {}

    def __init__(self):
        self.requeued = False

    def requeue(self):
        self.requeued = self.acknowledged = True

    def ack(self):
        self.acknowledged = True


class FailingReader:
    """Gives one message, then fails as a closed database connection would."""

    def __init__(self, message):
        self.given = [PulledMessage(["j1"], Tier.BATCH, message)]

    def get(self, tiers):
        if self.given:
            return self.given.pop()
        raise RuntimeError("connection already closed")


class Window:
    def likely_room(self) -> int:
        return 8


def test_messages_pulled_before_a_failure_go_back_to_their_queue():
    message = Message()
    intake = Intake(
        FailingReader(message),
        readers=None,
        service_name="s",
        batch_size=8,
        worker="w",
        pull_until=time.monotonic() + 60,
        line=Line(WeightedShare({"api": 5, "batch": 3, "offline": 2})),
        ledger=MessageLedger(None, "s"),
        report=BatchReport(),
    )
    with pytest.raises(RuntimeError):
        intake.pull(Window(), realtime=False)
    assert message.requeued
