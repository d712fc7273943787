"""Circuit breaker per backend, in Redis so every worker sees the same state.

closed ── `failure_threshold` consecutive failures ──▶ open (for `breaker_cooldown_s`)
open ── cooldown over ──▶ half-open: exactly one caller gets the probe
half-open ── probe succeeds ──▶ closed;  probe fails ──▶ open again

Failures are what says the backend itself is unwell (5xx, timeouts, connection errors, a local
engine that raises), never a 400 caused by the job's input or a 429 (that is a cooldown).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis

from routing.limits import LUA_NOW
from routing.redis_scripts import registered_script

# KEYS: state. ARGV: now, probe_ttl_s, take_probe. Returns {allowed, state}.
_ALLOW = (
    LUA_NOW
    + """
local h = redis.call('HMGET', KEYS[1], 'open_until', 'probe_until')
local open_until = tonumber(h[1] or '0')
if open_until == 0 then return {1, 'closed'} end
if now < open_until then return {0, 'open'} end
if tonumber(h[2] or '0') > now then return {0, 'half_open_probing'} end
if ARGV[3] == '1' then
  redis.call('HSET', KEYS[1], 'probe_until', tostring(now + tonumber(ARGV[2])))
end
return {1, 'half_open'}
"""
)

# KEYS: state. ARGV: now, threshold, cooldown_s. Returns the state afterwards.
_FAILURE = (
    LUA_NOW
    + """
local failures = redis.call('HINCRBY', KEYS[1], 'failures', 1)
local open_until = tonumber(redis.call('HGET', KEYS[1], 'open_until') or '0')
redis.call('PEXPIRE', KEYS[1], 86400000)
if open_until > 0 or failures >= tonumber(ARGV[2]) then
  local new = now + tonumber(ARGV[3])
  if new > open_until then redis.call('HSET', KEYS[1], 'open_until', tostring(new)) end
  redis.call('HDEL', KEYS[1], 'probe_until')
  return 'open'
end
return 'closed'
"""
)


@dataclass(frozen=True)
class BreakerState:
    allowed: bool
    state: str  # closed | open | half_open | half_open_probing


class CircuitBreaker:
    """`backend` arguments need `pk`, `failure_threshold`, `breaker_cooldown_s`, `timeout_s`."""

    def __init__(self, client: redis.Redis, *, clock: Callable[[], float] | None = None):
        self.redis = client
        self.clock = clock
        self._allow = registered_script(client, _ALLOW)
        self._failure = registered_script(client, _FAILURE)

    @staticmethod
    def key(backend_id: int) -> str:
        return f"renq:cb:{backend_id}"

    def _now(self) -> float:
        return self.clock() if self.clock is not None else -1.0

    def _check(self, backend, take_probe: bool) -> BreakerState:
        # The probe is held for one call's timeout: a probe that never reports back (its
        # worker died) frees the slot for the next caller.
        probe_ttl_s = max(1.0, float(getattr(backend, "timeout_s", 30.0)) * 2)
        allowed, state = self._allow(
            keys=[self.key(backend.pk)],
            args=[self._now(), probe_ttl_s, "1" if take_probe else "0"],
        )
        return BreakerState(bool(int(allowed)), state.decode())

    def peek(self, backend) -> BreakerState:
        """Whether a call would be let through now; changes nothing (the router asks this)."""
        return self._check(backend, take_probe=False)

    def acquire(self, backend) -> BreakerState:
        """Ask right before calling; in half-open this takes the single probe."""
        return self._check(backend, take_probe=True)

    def record_success(self, backend) -> None:
        self.redis.delete(self.key(backend.pk))

    def record_failure(self, backend) -> str:
        state = self._failure(
            keys=[self.key(backend.pk)],
            args=[self._now(), backend.failure_threshold, backend.breaker_cooldown_s],
        )
        return state.decode()
