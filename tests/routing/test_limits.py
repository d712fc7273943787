"""Rate limits and cooldowns on the real Redis: exact across processes, cooldowns only extend."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest

from renq_site.shared_redis import shared_redis
from routing.limits import RateLimitTracker, parse_duration_s, parse_rate_headers
from tests.conftest import ROOT, TEST_REDIS_URL


@dataclass
class FakeBackend:
    pk: int = 1
    rpm_limit: int = 0
    tpm_limit: int = 0
    rate_window_s: float = 60.0


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def tracker(clock):
    return RateLimitTracker(shared_redis(), clock=clock)


def test_rpm_is_per_minute_sliding_window(tracker, clock):
    backend = FakeBackend(rpm_limit=60)
    for i in range(60):
        clock.now += 0.5  # 60 calls over 30 s
        assert tracker.reserve(backend, 10), f"call {i} refused"
    refused = tracker.reserve(backend, 10)
    assert not refused and refused.reason == "rpm"
    # The first call leaves the window 60 s after it was made, and not before.
    first_call_at = 1_000_000.5
    assert refused.retry_at == pytest.approx(first_call_at + 60)
    clock.now = first_call_at + 59.9
    assert not tracker.reserve(backend, 10)
    clock.now = first_call_at + 60.01
    assert tracker.reserve(backend, 10)
    assert not tracker.reserve(backend, 10)


def test_tpm_counts_real_usage_after_reconcile(tracker, clock):
    backend = FakeBackend(tpm_limit=1000)
    first = tracker.reserve(backend, 900)
    assert first
    assert not tracker.reserve(backend, 200)  # 900 estimated + 200 > 1000
    tracker.reconcile(first, 300)  # the upstream billed 300
    assert tracker.reserve(backend, 600)
    assert not tracker.reserve(backend, 200)


def test_released_reservation_gives_the_request_back(tracker):
    backend = FakeBackend(rpm_limit=1)
    reservation = tracker.reserve(backend, 1)
    assert not tracker.reserve(backend, 1)
    tracker.release(reservation)
    assert tracker.reserve(backend, 1)


def test_cooldown_only_extends(tracker, clock):
    backend = FakeBackend()
    tracker.observe(backend.pk, {"Retry-After": "10"}, 429)
    clock.now += 1
    # A later 429 with a shorter retry-after must not shorten the cooldown in force.
    tracker.observe(backend.pk, {"retry-after": "2"}, 429)
    clock.now += 5  # 6 s after the first 429
    refused = tracker.reserve(backend, 1)
    assert not refused and refused.reason == "cooldown"
    assert refused.retry_at == pytest.approx(1_000_000.0 + 10)
    clock.now = 1_000_000.0 + 10.01
    assert tracker.reserve(backend, 1)


def test_429_without_retry_after_waits_for_the_reported_reset(tracker, clock):
    backend = FakeBackend()
    headers = {"x-ratelimit-remaining-requests": "0", "x-ratelimit-reset-requests": "6m0s"}
    tracker.observe(backend.pk, headers, 429)
    clock.now += 359
    assert not tracker.reserve(backend, 1)
    clock.now += 2
    assert tracker.reserve(backend, 1)


def test_upstream_remaining_zero_stops_calls_before_any_429(tracker, clock):
    backend = FakeBackend()
    tracker.observe(
        backend.pk,
        {"x-ratelimit-remaining-requests": "2", "x-ratelimit-reset-requests": "20s"},
        200,
    )
    assert tracker.reserve(backend, 1)
    assert tracker.reserve(backend, 1)
    refused = tracker.reserve(backend, 1)
    assert not refused and refused.reason == "upstream_requests"
    assert tracker.headroom(backend) == 0
    clock.now += 20.5  # the upstream's window reset
    assert tracker.reserve(backend, 1)


def test_header_parsing_follows_openai_formats():
    assert parse_duration_s("1s") == 1
    assert parse_duration_s("6m0s") == 360
    assert parse_duration_s("12ms") == pytest.approx(0.012)
    assert parse_duration_s("1h2m3.5s") == pytest.approx(3723.5)
    assert parse_duration_s("soon") is None
    seen = parse_rate_headers(
        {
            "X-RateLimit-Remaining-Requests": "4999",
            "x-ratelimit-remaining-tokens": "159976",
            "x-ratelimit-reset-requests": "12ms",
            "x-ratelimit-reset-tokens": "9ms",
            "Retry-After": "2",
        }
    )
    assert (seen.requests_left, seen.tokens_left, seen.retry_after_s) == (4999, 159976, 2)
    # OpenAI's (and Azure's) retry-after-ms is the finer of the two.
    seen = parse_rate_headers({"Retry-After": "2", "retry-after-ms": "1250"})
    assert seen.retry_after_s == 1.25


RACER = textwrap.dedent(
    """
    import json, os, sys, time
    import redis
    from routing.limits import RateLimitTracker

    class Backend:
        pk, rpm_limit, tpm_limit, rate_window_s = 77, 60, 0, float(sys.argv[2])

    tracker = RateLimitTracker(redis.Redis.from_url(sys.argv[1]))
    start_at, stop_at = float(sys.argv[3]), float(sys.argv[4])
    while time.time() < start_at:
        time.sleep(0.001)
    granted = []
    while time.time() < stop_at:
        if tracker.reserve(Backend, 5):
            granted.append(time.time())
        else:
            time.sleep(0.002)
    print(json.dumps(granted))
    """
)


def test_rpm_60_holds_for_three_processes_together():
    """Three processes race for one backend with rpm 60 (window shortened to 2 s so the test
    is fast): together they get 60 calls per window, not 3 × 60."""
    import time

    window_s = 2.0
    start_at = time.time() + 1.5  # every process is up and spinning before the race starts
    stop_at = start_at + window_s * 1.5  # spans into a second window
    racers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RACER,
                TEST_REDIS_URL,
                str(window_s),
                str(start_at),
                str(stop_at),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    per_process = [json.loads(r.communicate(timeout=30)[0]) for r in racers]
    assert all(r.returncode == 0 for r in racers)
    granted = sorted(t for times in per_process for t in times)
    in_first_window = [t for t in granted if t < start_at + window_s - 0.05]
    assert len(in_first_window) == 60, len(in_first_window)
    # Sliding: no stretch of one window ever holds more than 60 calls.
    for i, t in enumerate(granted):
        assert sum(1 for u in granted[i:] if u < t + window_s - 0.05) <= 60
    assert 60 < len(granted) <= 120  # the window slid and let the next calls through
    assert sum(1 for times in per_process if times) >= 2  # a real race, not one winner
