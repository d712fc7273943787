"""The circuit breaker on the real Redis: opens on consecutive failures, one half-open probe."""

from __future__ import annotations

from dataclasses import dataclass

from renq_site.shared_redis import shared_redis
from routing.breaker import CircuitBreaker


@dataclass
class FakeBackend:
    pk: int = 5
    failure_threshold: int = 3
    breaker_cooldown_s: float = 30.0
    timeout_s: float = 2.0


class Clock:
    now = 500.0

    def __call__(self) -> float:
        return self.now


def test_consecutive_failures_open_then_one_probe_closes_it():
    clock = Clock()
    breaker = CircuitBreaker(shared_redis(), clock=clock)
    backend = FakeBackend()
    assert breaker.record_failure(backend) == "closed"
    assert breaker.record_failure(backend) == "closed"
    assert breaker.record_failure(backend) == "open"
    assert breaker.peek(backend).state == "open"
    assert not breaker.acquire(backend).allowed

    clock.now += 30.5
    assert breaker.peek(backend).allowed  # peeking takes nothing
    probe = breaker.acquire(backend)
    assert probe.allowed and probe.state == "half_open"
    # Only one probe at a time, in every process.
    assert not CircuitBreaker(shared_redis(), clock=clock).acquire(backend).allowed
    breaker.record_success(backend)
    assert breaker.acquire(backend).state == "closed"


def test_a_success_resets_the_consecutive_count():
    breaker = CircuitBreaker(shared_redis(), clock=Clock())
    backend = FakeBackend()
    breaker.record_failure(backend)
    breaker.record_failure(backend)
    breaker.record_success(backend)
    assert breaker.record_failure(backend) == "closed"


def test_failed_probe_reopens_for_a_full_cooldown():
    clock = Clock()
    breaker = CircuitBreaker(shared_redis(), clock=clock)
    backend = FakeBackend(failure_threshold=1)
    breaker.record_failure(backend)
    clock.now += 31
    assert breaker.acquire(backend).state == "half_open"
    assert breaker.record_failure(backend) == "open"
    clock.now += 29
    assert not breaker.acquire(backend).allowed
    clock.now += 2
    assert breaker.acquire(backend).allowed
