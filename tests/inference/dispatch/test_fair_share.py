"""The fair share's tags: every tenant of a queue is banded on one scale."""

from __future__ import annotations

from inference.dispatch import fair_share
from renq_site.shared_redis import shared_redis

QUEUE = "fair-share-test.batch"


def _charge(tenant_id: int, tokens: int, jobs: int = 1) -> fair_share.Charge:
    return fair_share.Charge(
        queue=QUEUE,
        tenant_id=tenant_id,
        tokens=tokens,
        jobs=jobs,
        weight=1.0,
        batch_jobs=8,
        batch_tokens=16384,
    )


def test_tenants_with_small_and_large_jobs_sink_alike_for_the_same_work_ahead():
    for key in shared_redis().scan_iter(f"renq:fair:{QUEUE}:*"):
        shared_redis().delete(key)
    # Both tenants put 160 tokens of work ahead of the clock, one in 5-token jobs,
    # the other in 40-token jobs. The queue's mean job then sizes one quantum for both.
    small = fair_share.tag_messages([_charge(1, 5) for _ in range(32)], top=3)
    large = fair_share.tag_messages([_charge(2, 40) for _ in range(4)], top=3)
    next_small, next_large = fair_share.tag_messages([_charge(1, 5), _charge(2, 40)], top=3)

    assert next_small.start == next_large.start == 160
    assert next_small.priority == next_large.priority
    # And a tenant's first message is at the top, whatever its job size.
    assert small[0].priority == large[0].priority == 3


def test_while_a_worker_takes_only_a_tenant_with_nothing_ahead_goes_at_the_top():
    for key in shared_redis().scan_iter(f"renq:fair:{QUEUE}:*"):
        shared_redis().delete(key)
    holdable = [
        fair_share.Charge(
            queue=QUEUE, tenant_id=1, tokens=10, jobs=1, weight=1.0, batch_jobs=2,
            batch_tokens=16384, holdable=True,
        )
    ] * 3  # fmt: skip
    # Nobody took from the queue yet: nothing is held, the bands order it.
    assert [(t.priority, t.held) for t in fair_share.tag_messages(holdable, top=3)] == [
        (3, False), (3, False), (2, False),
    ]  # fmt: skip
    fair_share.advance({QUEUE: 30.0})  # a worker takes: the queue's quantum is 2 jobs, 20
    # Start 30 is V: the top; 40 lies within a quantum: under it; 50 to 80 lie a quantum or
    # more ahead: at the released work's level; 90 is three quanta ahead: held.
    assert [(t.priority, t.held) for t in fair_share.tag_messages(holdable * 3, top=3)] == [
        (3, False), (2, False), (1, False), (1, False), (1, False), (1, False), (2, True),
        (2, True), (2, True),
    ]  # fmt: skip
    # Once work is held, what starts beyond it is held too, however close V comes.
    fair_share.advance({QUEUE: 100.0})
    assert [(t.start, t.held) for t in fair_share.tag_messages(holdable[:1], top=3)] == [
        (120.0, True)
    ]
