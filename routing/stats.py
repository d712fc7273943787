"""Moving averages in Redis, measured from real work and shared by every process.

- `renq:lat:<backend id>`   seconds per call of a cloud backend (or per local job);
- `renq:cap:<service>`      jobs per second one local worker process gets through.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Generic, TypeVar

import redis

from renq_site.shared_redis import shared_redis
from routing.redis_scripts import registered_script

T = TypeVar("T")

# Weight of the newest sample: ~10 samples dominate, so a slow spell shows within seconds.
EWMA_ALPHA = 0.2

# KEYS: hash. ARGV: alpha, then the samples, oldest first. Atomic so concurrent workers never
# lose a sample.
_EWMA = """
local cur = redis.call('HGET', KEYS[1], 'ewma')
local alpha = tonumber(ARGV[1])
local x = cur and tonumber(cur)
for i = 2, #ARGV do
  local sample = tonumber(ARGV[i])
  if x then x = alpha * sample + (1 - alpha) * x else x = sample end
end
redis.call('HSET', KEYS[1], 'ewma', tostring(x))
redis.call('HINCRBY', KEYS[1], 'samples', #ARGV - 1)
return tostring(x)
"""


def _client(client: redis.Redis | None) -> redis.Redis:
    return client if client is not None else shared_redis()


def update_ewma(key: str, sample: float, *, client: redis.Redis | None = None) -> float:
    return update_ewma_with(key, [sample], client=client)


def update_ewma_with(
    key: str, samples: Sequence[float], *, client: redis.Redis | None = None
) -> float:
    """Add `samples`, oldest first, to the moving average at `key`, in one round trip."""
    conn = _client(client)
    args = [EWMA_ALPHA, *(float(sample) for sample in samples)]
    return float(registered_script(conn, _EWMA)(keys=[key], args=args))


class KeptSamples(Generic[T]):
    """One process's samples of shared statistics, kept back per key and handed over together
    at most once every `interval_s` (a key's first at once): a statistic sampled on every
    batch would otherwise cost every batch a Redis round trip. Samples not handed over are
    this process's only; a process that ends loses them, as a statistic may."""

    def __init__(self):
        self._lock = threading.Lock()
        self._kept: dict[str, list[T]] = {}
        self._sent_at: dict[str, float] = {}

    def add(self, key: str, sample: T, interval_s: float) -> list[T]:
        """Keep `sample`; the key's samples, oldest first, when they are due to be sent (the
        caller sends them), else none."""
        now = time.monotonic()
        with self._lock:
            self._kept.setdefault(key, []).append(sample)
            sent_at = self._sent_at.get(key)
            if sent_at is not None and now - sent_at < interval_s:
                return []
            self._sent_at[key] = now
            return self._kept.pop(key)

    def kept(self, key: str) -> list[T]:
        with self._lock:
            return list(self._kept.get(key, ()))

    def drop(self, key: str) -> None:
        with self._lock:
            self._kept.pop(key, None)


class SampleBuffer:
    """Samples of moving averages (update_ewma), sent as KeptSamples hands them over."""

    def __init__(self, interval_s: float):
        self.interval_s = interval_s
        self._samples: KeptSamples[float] = KeptSamples()

    def add(self, key: str, sample: float) -> None:
        """Raises what Redis raises when it is this call that sends (the samples are lost)."""
        due = self._samples.add(key, sample, self.interval_s)
        if due:
            update_ewma_with(key, due)


def read_ewma(key: str, *, client: redis.Redis | None = None) -> float | None:
    value = _client(client).hget(key, "ewma")
    return float(value) if value is not None else None


def latency_key(backend_id: int) -> str:
    return f"renq:lat:{backend_id}"


def throughput_key(service_name: str) -> str:
    return f"renq:cap:{service_name}"


def record_latency(backend_id: int, seconds: float) -> float:
    return update_ewma(latency_key(backend_id), seconds)


def measured_latency_s(backend_id: int) -> float | None:
    return read_ewma(latency_key(backend_id))
