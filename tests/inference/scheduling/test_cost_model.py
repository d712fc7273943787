"""The batch cost model the batch former predicts pass times with (shared in Redis)."""

from __future__ import annotations

from inference.scheduling.cost_model import PRIOR_PER_TOKEN_S, BatchCostModel


def test_a_worker_reuses_its_read_and_its_own_batches_refresh_it():
    loop = BatchCostModel("svc", "cpu", reuse_s=60)
    other_worker = BatchCostModel("svc", "cpu")
    assert loop.current().per_token_s == PRIOR_PER_TOKEN_S

    other_worker.observe_batch(1.0, 100)  # another worker's batch: seen after reuse_s
    assert loop.current().per_token_s == PRIOR_PER_TOKEN_S
    assert other_worker.current().per_token_s != PRIOR_PER_TOKEN_S

    loop.observe_batch(1.0, 100)  # its own: seen at once, with everything stored so far
    assert loop.current() == other_worker.current()
    assert loop.current().samples == 2


def test_its_own_observation_is_read_back_without_a_round_trip():
    from renq_site.shared_redis import shared_redis

    loop = BatchCostModel("svc-own", "cpu", reuse_s=60)
    loop.observe_batch(1.0, 100)
    stored = shared_redis().hgetall(loop.key)
    shared_redis().delete(loop.key)  # a read now would find the prior again

    cost = loop.current()
    assert cost.per_token_s == float(stored[b"per_token_s"]) != PRIOR_PER_TOKEN_S
    assert cost.samples == 1
