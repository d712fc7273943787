"""The batch window and tier aging, driven directly with a fake clock (no broker)."""

from __future__ import annotations

from collections import Counter

import pytest

from inference.jobs.tiers import Tier
from inference.scheduling.batch_window import BatchItem, BatchWindow


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


def make_reader(backlog: dict[Tier, int], weights=None):
    """A reader over in-memory queues (the unit under test is the tier choice)."""
    from inference.workers.tier_reader import DEFAULT_WEIGHTS, TierQueueReader, WeightedShare

    reader = TierQueueReader.__new__(TierQueueReader)
    reader._queues = {
        tier: FakeQueue(FakeMessage(f"{tier.value}-{i}") for i in range(backlog.get(tier, 0)))
        for tier in Tier
    }
    reader.share = WeightedShare(weights or DEFAULT_WEIGHTS)
    return reader


def take(reader):
    """What the worker does: pull a message, claim its jobs (all of them, here)."""
    pulled = reader.get()
    reader.claimed(pulled, len(pulled.job_ids))
    return pulled


def test_reader_takes_realtime_first_always():
    reader = make_reader({Tier.OFFLINE: 5, Tier.REALTIME: 3, Tier.BATCH: 5, Tier.API: 5})
    assert [take(reader).tier for _ in range(3)] == [Tier.REALTIME] * 3


def test_weighted_share_below_realtime_is_5_3_2_and_nobody_starves():
    reader = make_reader({Tier.API: 1000, Tier.BATCH: 1000, Tier.OFFLINE: 1000})
    taken = [take(reader).tier for _ in range(1000)]
    counts = Counter(taken)
    assert counts[Tier.API] == pytest.approx(500, abs=5)
    assert counts[Tier.BATCH] == pytest.approx(300, abs=5)
    assert counts[Tier.OFFLINE] == pytest.approx(200, abs=5)
    # The floor: every tier is served within every 10 jobs (one small batch).
    for start in range(0, 990, 10):
        assert set(taken[start : start + 10]) == {Tier.API, Tier.BATCH, Tier.OFFLINE}


def test_an_empty_tier_banks_no_credit():
    reader = make_reader({Tier.API: 100})
    assert [take(reader).tier for _ in range(50)] == [Tier.API] * 50
    # Offline work arrives after a quiet spell: it gets its share, not a burst of 50.
    reader._queues[Tier.OFFLINE].messages.extend(FakeMessage(f"late-{i}") for i in range(50))
    taken = [take(reader).tier for _ in range(10)]
    assert 2 <= taken.count(Tier.OFFLINE) <= 4


def test_a_tier_that_ran_alone_gets_its_share_as_soon_as_the_others_have_work():
    # An offline backlog runs alone (8 jobs to a message), then api and batch work arrives.
    reader = make_reader({})
    reader._queues[Tier.OFFLINE].messages.extend(
        FakeMessage([f"off-{i}-{j}" for j in range(8)]) for i in range(200)
    )
    assert {take(reader).tier for _ in range(20)} == {Tier.OFFLINE}
    reader._queues[Tier.API].messages.extend(FakeMessage(f"api-{i}") for i in range(1000))
    reader._queues[Tier.BATCH].messages.extend(FakeMessage(f"batch-{i}") for i in range(1000))
    jobs = []
    while len(jobs) < 80:
        pulled = take(reader)
        jobs += [pulled.tier] * len(pulled.job_ids)
    # 5:3:2 from the first jobs on: offline neither bursts ahead nor sits out its credit.
    first = Counter(jobs[:80])
    assert first[Tier.OFFLINE] == pytest.approx(16, abs=4)
    assert first[Tier.API] == pytest.approx(40, abs=4)
    assert first[Tier.BATCH] == pytest.approx(24, abs=4)


def test_a_non_realtime_batch_closes_before_its_predicted_run_exceeds_the_budget():
    # 1 ms per token: a 0.25 s budget holds 250 tokens of batch work.
    w = BatchWindow(
        max_jobs=64,
        timeout_s=10,
        max_tokens=100_000,
        clock=FakeClock(),
        max_run_s=0.25,
        predict_s=lambda tokens: tokens / 1000,
    )
    assert all(w.offer(BatchItem(i, tokens=100)) for i in range(2))
    assert not w.offer(BatchItem(2, tokens=100))  # 300 tokens: 0.3 s > 0.25 s
    assert w.should_close() and w.tokens == 200


def test_one_job_larger_than_the_budget_still_runs_alone():
    w = BatchWindow(
        max_jobs=64,
        timeout_s=10,
        max_tokens=100_000,
        max_run_s=0.25,
        predict_s=lambda tokens: tokens / 1000,
    )
    assert w.offer(BatchItem("huge", tokens=5000))
    assert not w.offer(BatchItem("next", tokens=1))


def test_the_share_counts_jobs_not_messages():
    # Offline work submitted in lists travels 8 jobs to a message; api work one by one.
    reader = make_reader({Tier.API: 1000})
    reader._queues[Tier.OFFLINE].messages.extend(
        FakeMessage([f"off-{i}-{j}" for j in range(8)]) for i in range(100)
    )
    jobs = Counter()
    for _ in range(300):
        pulled = take(reader)
        jobs[pulled.tier] += len(pulled.job_ids)
    # api : offline = 5 : 2 in jobs (not in messages, which would give offline 8 × its share).
    assert jobs[Tier.OFFLINE] / jobs[Tier.API] == pytest.approx(2 / 5, rel=0.1)


def test_messages_whose_jobs_cannot_run_cost_their_tier_no_share():
    # The api queue's head: 40 messages of jobs that expired while queued (claimed: 0).
    reader = make_reader({Tier.API: 40, Tier.BATCH: 1000, Tier.OFFLINE: 1000})
    reader._queues[Tier.API].messages.extend(FakeMessage(f"live-{i}") for i in range(500))
    taken = Counter()
    for _ in range(540):
        pulled = reader.get()
        dead = pulled.tier == Tier.API and not pulled.job_ids[0].startswith("live-")
        reader.claimed(pulled, 0 if dead else 1)
        if not dead:
            taken[pulled.tier] += 1
    # The live api jobs behind the dead ones still get api's 5 of every 10 jobs run.
    assert taken[Tier.API] / sum(taken.values()) == pytest.approx(0.5, abs=0.02)


def test_likely_room_is_how_many_more_such_jobs_fit():
    w = BatchWindow(
        max_jobs=64,
        timeout_s=10,
        max_tokens=1000,
        max_run_s=0.5,
        predict_s=lambda tokens: tokens / 1000,  # 1 ms per token
    )
    assert w.likely_room() == 1  # empty: the first job's size is unknown
    assert w.offer(BatchItem("a", tokens=100))
    assert w.likely_room() == 4  # 500 tokens = the 0.5 s run budget
    w.max_run_s = None
    assert w.likely_room() == 9  # then the 1,000-token budget
    w.max_jobs = 3
    assert w.likely_room() == 2
    w.max_jobs, w.max_tokens = 64, 150
    assert w.likely_room() == 0  # another such job would not fit: none worth claiming now
