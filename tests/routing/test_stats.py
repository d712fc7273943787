"""Moving averages shared in Redis, as routing and scaling read them."""

from __future__ import annotations

import time

import pytest

from renq_site.shared_redis import shared_redis
from routing.stats import EWMA_ALPHA, SampleBuffer, read_ewma, update_ewma


def test_samples_reach_the_average_together_and_in_order():
    key = "renq:cap:buffered"
    batches = SampleBuffer(interval_s=0.05)
    batches.add(key, 10.0)  # a process's first sample goes at once
    assert read_ewma(key) == 10.0

    batches.add(key, 20.0)  # within the interval: kept back
    assert read_ewma(key) == 10.0
    time.sleep(0.06)
    batches.add(key, 30.0)  # due: sent with the one kept back, oldest first
    expected = 10.0
    for sample in (20.0, 30.0):
        expected = EWMA_ALPHA * sample + (1 - EWMA_ALPHA) * expected
    assert read_ewma(key) == pytest.approx(expected)
    assert int(shared_redis().hget(key, "samples")) == 3


def test_one_sample_updates_at_once():
    key = "renq:lat:77"
    assert update_ewma(key, 2.0) == 2.0
    assert update_ewma(key, 1.0) == pytest.approx(EWMA_ALPHA * 1.0 + (1 - EWMA_ALPHA) * 2.0)
