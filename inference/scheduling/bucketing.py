"""Length bucketing: split a batch of sequences into groups that pad little.

A padded forward pass costs `rows × longest row` tokens, so one batch mixing 8-token and
120-token texts wastes most of its compute on padding. Grouping sequences of similar length
keeps that waste bounded while still running as few forward passes as possible.

Pure Python (no torch) so the scheduler and benchmarks can plan batches without a model.
"""

from __future__ import annotations

from collections.abc import Sequence


def plan_length_buckets(
    lengths: Sequence[int],
    *,
    max_items: int | None = None,
    max_padding_ratio: float = 0.25,
    max_tokens: int | None = None,
) -> list[list[int]]:
    """Group indices of `lengths` into buckets to be padded and run together.

    Every index appears in exactly one bucket. A bucket only grows while
    - its padding (size × longest − sum of lengths) is at most `max_padding_ratio` of the
      padded tokens (size × longest),
    - it holds at most `max_items` items, and
    - its padded tokens (size × longest) stay within `max_tokens`.
    An item that alone exceeds `max_tokens` still gets its own bucket: it is never dropped.
    Buckets come out shortest first; indices within a bucket are in ascending length order.
    """
    if max_items is not None and max_items < 1:
        raise ValueError("max_items must be at least 1")
    if max_padding_ratio < 0:
        raise ValueError("max_padding_ratio must not be negative")

    # Sorted by length (ties by index, so the plan is deterministic): each new item is the
    # longest so far, which makes the padding of a candidate bucket cheap to compute.
    order = sorted(range(len(lengths)), key=lambda index: (lengths[index], index))
    buckets: list[list[int]] = []
    current: list[int] = []
    current_sum = 0
    for index in order:
        length = lengths[index]
        if current:
            size = len(current) + 1
            padded = size * length
            fits = (
                (max_items is None or size <= max_items)
                and (max_tokens is None or padded <= max_tokens)
                and padded - (current_sum + length) <= max_padding_ratio * padded
            )
            if fits:
                current.append(index)
                current_sum += length
                continue
            buckets.append(current)
        current = [index]
        current_sum = length
    if current:
        buckets.append(current)
    return buckets


def padding_stats(lengths: Sequence[int], buckets: Sequence[Sequence[int]]) -> tuple[int, int]:
    """Return (tokens computed with padding, useful tokens) for running `buckets`.

    Compare with `padding_stats(lengths, [list(range(len(lengths)))])`, the cost of one padded
    batch, to report how much padding the buckets saved.
    """
    computed = sum(len(bucket) * max(lengths[i] for i in bucket) for bucket in buckets if bucket)
    useful = sum(lengths[i] for bucket in buckets for i in bucket)
    return computed, useful
