"""Moving averages in Redis, measured from real work and shared by every process.

- `renq:lat:<backend id>`   seconds per call of a cloud backend (or per local job);
- `renq:cap:<service>`      jobs per second one local worker process gets through.
"""

from __future__ import annotations

import redis

from renq_site.shared_redis import shared_redis
from routing.redis_scripts import registered_script

# Weight of the newest sample: ~10 samples dominate, so a slow spell shows within seconds.
EWMA_ALPHA = 0.2

# KEYS: hash. ARGV: sample, alpha. Atomic so concurrent workers never lose a sample.
_EWMA = """
local cur = redis.call('HGET', KEYS[1], 'ewma')
local x = tonumber(ARGV[1])
if cur then x = tonumber(ARGV[2]) * x + (1 - tonumber(ARGV[2])) * tonumber(cur) end
redis.call('HSET', KEYS[1], 'ewma', tostring(x))
redis.call('HINCRBY', KEYS[1], 'samples', 1)
return tostring(x)
"""


def _client(client: redis.Redis | None) -> redis.Redis:
    return client if client is not None else shared_redis()


def update_ewma(key: str, sample: float, *, client: redis.Redis | None = None) -> float:
    conn = _client(client)
    return float(registered_script(conn, _EWMA)(keys=[key], args=[float(sample), EWMA_ALPHA]))


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
