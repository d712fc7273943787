"""The batch window: when a micro-batch stops growing and goes to the model.

A window closes at `max_jobs`, at `max_tokens`, or `timeout_s` after its first job *arrived*
(its submission time, not when the previous batch finished: ray#36510, torchserve#2478), and at
once when it holds a realtime job, which never waits for company. A window of non-realtime work
also closes before its predicted run time (`predict_s(tokens)`, the service's cost model)
would exceed `max_run_s`, the preemption budget: a realtime job arriving at any moment then
waits for one bounded batch at most.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass
class BatchItem(Generic[T]):
    value: T
    tokens: int
    realtime: bool = False


@dataclass
class BatchWindow(Generic[T]):
    max_jobs: int
    timeout_s: float
    max_tokens: int
    clock: Callable[[], float] = time.time
    # Bounded preemption: the most a non-realtime batch may be predicted to run.
    max_run_s: float | None = None
    predict_s: Callable[[int], float] | None = None
    items: list[BatchItem[T]] = field(default_factory=list)
    deadline: float | None = None
    tokens: int = 0
    full: bool = False

    def __post_init__(self) -> None:
        if self.max_jobs < 1:
            raise ValueError(f"max_jobs must be >= 1, got {self.max_jobs}")
        if self.timeout_s < 0:
            raise ValueError(f"timeout_s must be >= 0, got {self.timeout_s}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    def offer(self, item: BatchItem[T], *, arrived_at: float | None = None) -> bool:
        """Add `item` if it fits. A job larger than the whole token budget is still taken when
        the window is empty: it runs alone rather than never (TEI#723)."""
        if self.items and (
            len(self.items) >= self.max_jobs
            or self.tokens + item.tokens > self.max_tokens
            or self._over_run_budget(self.tokens + item.tokens, item)
        ):
            self.full = True
            return False
        if not self.items:
            start = self.clock() if arrived_at is None else arrived_at
            self.deadline = start + self.timeout_s
        self.items.append(item)
        self.tokens += item.tokens
        if len(self.items) >= self.max_jobs or self.tokens >= self.max_tokens:
            self.full = True
        return True

    def _over_run_budget(self, tokens: int, item: BatchItem[T]) -> bool:
        if self.max_run_s is None or self.predict_s is None:
            return False
        if item.realtime and self.has_realtime:
            return False  # realtime company is what a realtime batch is for
        return self.predict_s(tokens) > self.max_run_s

    def likely_room(self) -> int:
        """How many more jobs like the ones already in would fit (jobs, tokens, run budget):
        how many messages are worth pulling before claiming them together. 1 while empty;
        0 when no such job would fit (pulling one would only claim it to wait)."""
        slots = self.max_jobs - len(self.items)
        if self.full or slots <= 0:
            return 0
        if not self.items:
            return 1
        mean_tokens = self.tokens / len(self.items)

        def fits(n: int) -> bool:
            tokens = self.tokens + n * mean_tokens
            if tokens > self.max_tokens:
                return False
            if self.max_run_s is not None and self.predict_s is not None:
                return self.predict_s(int(tokens)) <= self.max_run_s
            return True

        # More jobs only add tokens and run time: the most that fit, by bisection, so a large
        # window asks the cost model a few times before a pull, not once per slot.
        low, high = 0, slots
        while low < high:
            middle = (low + high + 1) // 2
            if fits(middle):
                low = middle
            else:
                high = middle - 1
        return low

    @property
    def has_realtime(self) -> bool:
        return any(item.realtime for item in self.items)

    def remaining_s(self) -> float:
        if self.deadline is None:
            return self.timeout_s
        return max(0.0, self.deadline - self.clock())

    def should_close(self) -> bool:
        """True when waiting for more jobs can no longer help this batch."""
        if not self.items:
            return False
        return self.full or self.has_realtime or self.remaining_s() <= 0.0

    def __len__(self) -> int:
        return len(self.items)

    def values(self) -> list[T]:
        return [item.value for item in self.items]
