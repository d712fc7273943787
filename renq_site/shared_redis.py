"""The Redis client every process shares for counters that must be global: rate limits,
breakers, moving averages, admission counters. Disposable state only; Postgres is the record."""

from __future__ import annotations

from functools import lru_cache

import redis
from django.conf import settings


@lru_cache(maxsize=1)
def shared_redis() -> redis.Redis:
    return redis.Redis.from_url(settings.RENQ_REDIS_URL)
