"""The batch cost model the batch former predicts pass times with (shared in Redis)."""

from __future__ import annotations

import time

import pytest

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


def test_a_worker_predicts_with_its_batches_at_once_and_sends_them_together():
    # A round trip per batch would be one per idle realtime request: a worker process's
    # batches reach Redis at most once per reuse_s, and its predictions use each one at once.
    loop = BatchCostModel("svc-batched", "cpu", reuse_s=0.05)
    other_worker = BatchCostModel("svc-batched", "cpu")
    loop.observe_batch(1.0, 100)  # the process's first: sent at once
    loop.observe_batch(2.0, 100)  # kept back
    assert other_worker.current().samples == 1
    assert loop.current().samples == 2
    next_task = BatchCostModel("svc-batched", "cpu", reuse_s=0.05)
    assert next_task.current() == loop.current()  # Redis's, and the process's kept back

    time.sleep(0.06)
    loop.observe_batch(3.0, 100)  # due: sent with the one kept back, oldest first
    stored = other_worker.current()
    assert stored.samples == 3
    assert stored.per_token_s == pytest.approx(loop.current().per_token_s)


def test_batches_observed_before_the_model_was_reset_are_dropped():
    from renq_site.shared_redis import shared_redis

    loop = BatchCostModel("svc-reset", "cpu", reuse_s=60)
    loop.observe_batch(1.0, 100)
    loop.observe_batch(0.001, 100)  # kept back, made against the model about to go
    shared_redis().delete(loop.key)
    seeded = BatchCostModel("svc-reset", "cpu")
    seeded.observe_batch(0.5, 100)  # a new model, as an operator or a test sets one

    next_task = BatchCostModel("svc-reset", "cpu", reuse_s=60)
    assert next_task.current() == seeded.current()
    assert next_task.current().samples == 1
