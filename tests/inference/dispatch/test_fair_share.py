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
