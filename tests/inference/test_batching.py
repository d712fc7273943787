"""The batch window and tier aging, driven directly with a fake clock (no broker)."""

from __future__ import annotations

import pytest

from inference.batching import BatchItem, BatchWindow
from inference.tiers import AGING_INTERVAL_S, Tier


class FakeClock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def window(clock, **kw) -> BatchWindow:
    return BatchWindow(
        max_jobs=kw.get("max_jobs", 4),
        timeout_s=kw.get("timeout_s", 0.05),
        max_tokens=kw.get("max_tokens", 100),
        clock=clock,
    )


def test_closes_at_size():
    clock = FakeClock()
    w = window(clock, max_jobs=3)
    for i in range(3):
        assert w.offer(BatchItem(i, tokens=1))
    assert w.should_close()
    assert not w.offer(BatchItem(99, tokens=1))
    assert w.values() == [0, 1, 2]


def test_deadline_counts_from_the_first_jobs_arrival_not_from_now():
    clock = FakeClock(1000.0)
    w = window(clock, timeout_s=0.05)
    # The first job was submitted 40 ms before the worker saw it: 10 ms of window remain.
    w.offer(BatchItem("a", tokens=1), arrived_at=999.96)
    assert w.remaining_s() == pytest.approx(0.01)
    assert not w.should_close()
    clock.now += 0.011
    assert w.should_close()


def test_token_budget_refuses_what_does_not_fit_but_never_an_empty_window():
    clock = FakeClock()
    w = window(clock, max_tokens=10)
    assert w.offer(BatchItem("big", tokens=50))  # alone, rather than never
    assert w.should_close()
    w2 = window(clock, max_tokens=10)
    assert w2.offer(BatchItem("a", tokens=6))
    assert not w2.offer(BatchItem("b", tokens=6))
    assert w2.values() == ["a"] and w2.should_close()


def test_realtime_closes_the_window_at_once():
    clock = FakeClock()
    w = window(clock, timeout_s=10)
    w.offer(BatchItem("rt", tokens=1, realtime=True))
    assert w.should_close()


def test_rejects_nonsense_settings_naming_them():
    with pytest.raises(ValueError, match="max_jobs"):
        BatchWindow(max_jobs=0, timeout_s=0.1, max_tokens=10)
    with pytest.raises(ValueError, match="timeout_s"):
        BatchWindow(max_jobs=1, timeout_s=-1, max_tokens=10)


class FakeQueue:
    def __init__(self, messages):
        self.messages = list(messages)

    def get(self, no_ack=False, accept=None):
        return self.messages.pop(0) if self.messages else None


class FakeMessage:
    def __init__(self, job_id):
        self.job_id = job_id
        self.delivery_info = {"redelivered": False}

    def decode(self):
        return [[self.job_id], {}, {}]


def make_reader(clock, backlog: dict[Tier, int]):
    from inference.workers.tier_reader import TierQueueReader

    reader = TierQueueReader.__new__(TierQueueReader)
    reader.clock = clock
    reader._queues = {
        tier: FakeQueue(FakeMessage(f"{tier.value}-{i}") for i in range(backlog.get(tier, 0)))
        for tier in Tier
    }
    reader._last_served = {tier: clock() for tier in Tier}
    return reader


def test_reader_takes_the_highest_tier_first():
    clock = FakeClock()
    reader = make_reader(clock, {Tier.OFFLINE: 2, Tier.REALTIME: 1, Tier.BATCH: 1})
    order = []
    while (pm := reader.get()) is not None:
        order.append(pm.tier)
    assert order == [Tier.REALTIME, Tier.BATCH, Tier.OFFLINE, Tier.OFFLINE]


def test_aging_lets_a_starved_tier_jump_the_queue_then_strict_order_resumes():
    clock = FakeClock()
    reader = make_reader(clock, {Tier.API: 10_000, Tier.OFFLINE: 3})
    served = []
    # Sustained api load, one pull every 100 ms: offline is starved until its interval passes.
    for _ in range(700):
        served.append((clock.now - 1000.0, reader.get().tier))
        clock.now += 0.1
    offline_times = [t for t, tier in served if tier == Tier.OFFLINE]
    interval = AGING_INTERVAL_S[Tier.OFFLINE]
    assert len(offline_times) == 2
    assert interval <= offline_times[0] <= interval + 1.0
    # Served once, then strict order again until it is overdue anew.
    assert interval <= offline_times[1] - offline_times[0] <= interval + 1.0
    assert sum(tier == Tier.API for _, tier in served) == 698
