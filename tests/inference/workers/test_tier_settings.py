"""A running tier reader follows config.yaml `tiers:` weights: they are re-read once the
configuration change marker moves, no more often than the pool's recheck interval."""

from __future__ import annotations

import pytest
from django.db import OperationalError

from inference.config.models import SchedulerSettings
from inference.config.tiers import tier_policies
from inference.jobs.tiers import Tier
from inference.workers.tier_reader import ReaderPool

pytestmark = pytest.mark.django_db


class FakeQueue:
    """An empty tier queue: what the reader declares and pulls from."""

    def __call__(self, channel) -> FakeQueue:
        return self

    def declare(self) -> None:
        pass

    def get(self, no_ack: bool = False, accept=None):
        return None


class FakeChannel:
    def close(self) -> None:
        pass


class FakeConnection:
    def channel(self) -> FakeChannel:
        return FakeChannel()

    def release(self) -> None:
        pass


def configured_weights() -> dict[str, float]:
    """What the worker passes (inference.tasks): the weights of config.yaml `tiers:`."""
    return {tier: policy.weight for tier, policy in tier_policies().items()}


def configure_weights(api: float, batch: float, offline: float) -> None:
    # A save, as the admin or `renq_config load` makes it: the change marker moves.
    SchedulerSettings.objects.update_or_create(
        pk=SchedulerSettings.SINGLETON_PK,
        defaults={
            "tiers": {
                "api": {"weight": api},
                "batch": {"weight": batch},
                "offline": {"weight": offline},
            }
        },
    )


def pool(weights=configured_weights, recheck_s: float = 0.0) -> ReaderPool:
    """A worker's reader pool on fake broker connections; `recheck_s`: how often it may look
    at the change marker."""
    return ReaderPool(
        FakeConnection, lambda _name: FakeQueue(), weights, weights_recheck_s=recheck_s
    )


def picks(reader, count: int) -> dict[Tier, int]:
    """Which tiers the share serves first over `count` single jobs, every tier having work."""
    taken = dict.fromkeys(reader.share.TIERS, 0)
    for _ in range(count):
        tier = reader.share.order()[0]
        reader.share.served(tier, 1)
        taken[tier] += 1
    return taken


def test_a_running_reader_picks_up_new_weights_after_a_config_change():
    configure_weights(api=5.0, batch=3.0, offline=2.0)
    readers = pool()
    reader = readers.get("svc")
    assert reader.share.weights == {Tier.API: 5.0, Tier.BATCH: 3.0, Tier.OFFLINE: 2.0}
    assert picks(reader, 10) == {Tier.API: 5, Tier.BATCH: 3, Tier.OFFLINE: 2}

    configure_weights(api=1.0, batch=1.0, offline=8.0)
    assert reader.get() is None  # a pull of the running reader (every queue empty)
    assert reader.share.weights == {Tier.API: 1.0, Tier.BATCH: 1.0, Tier.OFFLINE: 8.0}
    assert picks(reader, 10) == {Tier.API: 1, Tier.BATCH: 1, Tier.OFFLINE: 8}
    assert readers.get("svc") is reader  # the same reader, not a new one
    readers.close_all()


def test_the_marker_is_read_no_more_often_than_the_recheck_interval():
    configure_weights(api=5.0, batch=3.0, offline=2.0)
    readers = pool(recheck_s=3600.0)
    reader = readers.get("svc")
    configure_weights(api=1.0, batch=1.0, offline=8.0)
    reader.get()
    assert reader.share.weights[Tier.OFFLINE] == 2.0  # not looked at again yet
    readers.close_all()


def test_weights_that_cannot_be_read_are_read_at_the_next_pull():
    configure_weights(api=5.0, batch=3.0, offline=2.0)
    database_down = False

    def weights() -> dict[str, float]:
        if database_down:
            raise OperationalError("server closed the connection unexpectedly")
        return configured_weights()

    readers = pool(weights)
    reader = readers.get("svc")
    configure_weights(api=1.0, batch=1.0, offline=8.0)
    database_down = True
    assert reader.get() is None  # the reader keeps serving with the weights it has
    assert reader.share.weights[Tier.OFFLINE] == 2.0
    database_down = False
    reader.get()  # no new change since, but the last one was never applied
    assert reader.share.weights[Tier.OFFLINE] == 8.0
    readers.close_all()
