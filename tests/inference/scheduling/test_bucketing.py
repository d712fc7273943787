"""Length bucketing: pure Python, no model needed."""

import random

import pytest

from inference.scheduling.bucketing import padding_stats, plan_length_buckets


def assert_partition(buckets: list[list[int]], count: int) -> None:
    flat = [index for bucket in buckets for index in bucket]
    assert sorted(flat) == list(range(count)), "every index exactly once"
    assert all(buckets), "no empty buckets"


def test_empty_input_gives_no_buckets():
    assert plan_length_buckets([]) == []
    assert padding_stats([], []) == (0, 0)


def test_equal_lengths_share_one_bucket():
    assert plan_length_buckets([7, 7, 7, 7]) == [[0, 1, 2, 3]]


def test_every_index_exactly_once_on_random_lengths():
    rng = random.Random(1234)
    for _ in range(200):
        lengths = [rng.randint(1, 300) for _ in range(rng.randint(1, 60))]
        buckets = plan_length_buckets(
            lengths,
            max_items=rng.choice([None, 1, 3, 16]),
            max_padding_ratio=rng.choice([0.0, 0.1, 0.25, 1.0]),
            max_tokens=rng.choice([None, 50, 500, 5000]),
        )
        assert_partition(buckets, len(lengths))


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.25, 0.5])
def test_padding_ratio_is_respected(ratio):
    rng = random.Random(99)
    lengths = [rng.randint(1, 200) for _ in range(300)]
    buckets = plan_length_buckets(lengths, max_padding_ratio=ratio)
    assert_partition(buckets, len(lengths))
    for bucket in buckets:
        padded = len(bucket) * max(lengths[i] for i in bucket)
        useful = sum(lengths[i] for i in bucket)
        assert padded - useful <= ratio * padded


def test_zero_ratio_only_groups_identical_lengths():
    lengths = [5, 6, 5, 6, 7]
    buckets = plan_length_buckets(lengths, max_padding_ratio=0.0)
    assert buckets == [[0, 2], [1, 3], [4]]


def test_max_items_and_max_tokens_are_respected():
    lengths = [10] * 25
    buckets = plan_length_buckets(lengths, max_items=8)
    assert [len(bucket) for bucket in buckets] == [8, 8, 8, 1]
    buckets = plan_length_buckets(lengths, max_tokens=45)
    assert all(len(bucket) * 10 <= 45 for bucket in buckets)
    assert_partition(buckets, len(lengths))


def test_item_over_token_budget_goes_alone():
    lengths = [4, 500, 4, 600]
    buckets = plan_length_buckets(lengths, max_tokens=100, max_padding_ratio=1.0)
    assert_partition(buckets, len(lengths))
    assert [0, 2] in buckets
    assert [1] in buckets and [3] in buckets


def test_buckets_come_out_shortest_first():
    lengths = [100, 3, 20, 3, 100]
    buckets = plan_length_buckets(lengths)
    assert buckets == [[1, 3], [2], [0, 4]]


def test_invalid_arguments_are_rejected():
    with pytest.raises(ValueError):
        plan_length_buckets([1, 2], max_items=0)
    with pytest.raises(ValueError):
        plan_length_buckets([1, 2], max_padding_ratio=-0.1)


def test_padding_stats_hand_computed():
    lengths = [3, 5, 10, 8]
    # [3, 5] padded to 5 → 10 tokens; [10, 8] padded to 10 → 20 tokens. Useful: 26.
    assert padding_stats(lengths, [[0, 1], [2, 3]]) == (30, 26)
    # One padded batch: 4 × 10.
    assert padding_stats(lengths, [[0, 1, 2, 3]]) == (40, 26)


def test_bucketing_mixed_lengths_saves_most_padding():
    lengths = [8] * 50 + [120] * 50
    one_batch_computed, useful = padding_stats(lengths, [list(range(len(lengths)))])
    buckets = plan_length_buckets(lengths)
    computed, bucket_useful = padding_stats(lengths, buckets)
    assert useful == bucket_useful == 50 * 8 + 50 * 120
    assert one_batch_computed == 100 * 120
    assert computed == useful  # two buckets, no padding at all
    assert computed < 0.6 * one_batch_computed
