"""Rate limits and cooldowns of every backend, shared by all workers through Redis.

Why Redis and not Postgres: every call reserves before it starts and reconciles after, so the
counters take several writes per upstream call from every I/O worker. A Lua script runs
atomically on the Redis server (no lock round-trips, no row contention, no vacuum churn), and
Redis expires old windows by itself. Postgres stays the record of truth for jobs and attempts;
these counters are disposable (a lost counter only forgets at most one window).

Per backend:
- `renq:rl:<id>:log`  sorted set, the sliding window log: one member `<reservation>:<tokens>`
  per call, scored by its start time. rpm = members in the window; tpm = their token sum.
- `renq:rl:<id>:up`   hash, what the upstream last told us (x-ratelimit-remaining-requests/
  -tokens with their reset times). Every reservation counts it down, so a backend at 0 is
  skipped *before* it answers 429.
- `renq:rl:<id>:cool` cooldown-until timestamp after a 429. Only ever extended (litellm#40130:
  a later, shorter Retry-After must not shorten a cooldown in force).

All times come from one clock: Redis's own TIME unless a clock is injected (unit tests), so
workers on different hosts agree.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime

import redis

from routing.redis_scripts import registered_script

# Unknown reset time after a 429 without any header: wait this long before trying again.
DEFAULT_429_COOLDOWN_S = 1.0
# No cooldown longer than this, whatever a header says (a broken header must not kill a route).
MAX_COOLDOWN_S = 3600.0

# Lua prelude shared by every script here and in routing.breaker: `now` is ARGV[1], or Redis's
# own clock when ARGV[1] < 0, so workers on different hosts agree on time.
LUA_NOW = """
local now = tonumber(ARGV[1])
if now < 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) + tonumber(t[2]) / 1000000
end
"""

# KEYS: log, up, cool. ARGV: now, window_s, rpm, tpm, tokens, reservation id, check_only.
_RESERVE = (
    LUA_NOW
    + """
local window = tonumber(ARGV[2])
local rpm, tpm, tokens = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local cool = tonumber(redis.call('GET', KEYS[3]) or '0')
if cool > now then return {0, 'cooldown', tostring(cool)} end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local entries = redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')
local count = #entries / 2
if rpm > 0 and count + 1 > rpm then
  return {0, 'rpm', tostring(tonumber(entries[2]) + window)}
end
if tpm > 0 and count > 0 then
  local used = 0
  for i = 1, #entries, 2 do used = used + tonumber(string.match(entries[i], ':(%d+)$')) end
  -- A job larger than the whole tpm still runs, alone, rather than never.
  if used + tokens > tpm then return {0, 'tpm', tostring(tonumber(entries[2]) + window)} end
end
local up = redis.call('HMGET', KEYS[2], 'req_left', 'req_reset', 'tok_left', 'tok_reset')
if up[1] and up[2] and tonumber(up[2]) > now and tonumber(up[1]) < 1 then
  return {0, 'upstream_requests', up[2]}
end
if up[3] and up[4] and tonumber(up[4]) > now and tonumber(up[3]) < tokens then
  return {0, 'upstream_tokens', up[4]}
end
if ARGV[7] == '1' then return {1, 'ok', tostring(now)} end
redis.call('ZADD', KEYS[1], now, ARGV[6] .. ':' .. tokens)
redis.call('PEXPIRE', KEYS[1], math.ceil(window * 1000) + 1000)
if up[1] and up[2] and tonumber(up[2]) > now then redis.call('HINCRBY', KEYS[2], 'req_left', -1) end
if up[3] and up[4] and tonumber(up[4]) > now then
  redis.call('HINCRBY', KEYS[2], 'tok_left', -tokens)
end
return {1, 'ok', tostring(now)}
"""
)

# KEYS: log. ARGV: reservation id, estimated tokens, actual tokens.
_RECONCILE = """
local old = ARGV[1] .. ':' .. ARGV[2]
local score = redis.call('ZSCORE', KEYS[1], old)
if not score then return 0 end
redis.call('ZREM', KEYS[1], old)
redis.call('ZADD', KEYS[1], score, ARGV[1] .. ':' .. ARGV[3])
return 1
"""

# KEYS: cool. ARGV: now, seconds. Returns the cooldown-until in force afterwards.
_EXTEND_COOLDOWN = (
    LUA_NOW
    + """
local new = now + tonumber(ARGV[2])
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
if new > cur then
  redis.call('SET', KEYS[1], tostring(new), 'PX', math.ceil((new - now) * 1000) + 1000)
  return tostring(new)
end
return tostring(cur)
"""
)

# KEYS: up. ARGV: now, req_left, req_reset_s, tok_left, tok_reset_s ('' = not reported).
_OBSERVE = (
    LUA_NOW
    + """
local longest = 0
if ARGV[2] ~= '' and ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'req_left', ARGV[2], 'req_reset', tostring(now + tonumber(ARGV[3])))
  longest = math.max(longest, tonumber(ARGV[3]))
end
if ARGV[4] ~= '' and ARGV[5] ~= '' then
  redis.call('HSET', KEYS[1], 'tok_left', ARGV[4], 'tok_reset', tostring(now + tonumber(ARGV[5])))
  longest = math.max(longest, tonumber(ARGV[5]))
end
if longest > 0 then redis.call('PEXPIRE', KEYS[1], math.ceil(longest * 1000) + 1000) end
return 1
"""
)

# KEYS: log, up, cool. ARGV: now, window_s. Returns now, cooldown, count, tokens, req_left,
# req_reset, tok_left, tok_reset (strings; '' when unknown).
_STATUS = (
    LUA_NOW
    + """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - tonumber(ARGV[2]))
local entries = redis.call('ZRANGE', KEYS[1], 0, -1)
local used = 0
for i = 1, #entries do used = used + tonumber(string.match(entries[i], ':(%d+)$')) end
local up = redis.call('HMGET', KEYS[2], 'req_left', 'req_reset', 'tok_left', 'tok_reset')
return {tostring(now), redis.call('GET', KEYS[3]) or '', tostring(#entries), tostring(used),
        up[1] or '', up[2] or '', up[3] or '', up[4] or ''}
"""
)


@dataclass(frozen=True)
class Reservation:
    granted: bool
    backend_id: int
    reservation_id: str = ""
    tokens: int = 0
    # Why not granted: cooldown | rpm | tpm | upstream_requests | upstream_tokens.
    reason: str = ""
    # When it is worth asking again (same clock as the tracker's).
    retry_at: float = 0.0

    def __bool__(self) -> bool:
        return self.granted


@dataclass(frozen=True)
class LimitStatus:
    now: float
    cooldown_until: float
    requests_in_window: int
    tokens_in_window: int
    upstream_requests_left: int | None
    upstream_tokens_left: int | None

    @property
    def cooling_down(self) -> bool:
        return self.cooldown_until > self.now


@dataclass(frozen=True)
class RateHeaders:
    """What one response said about the upstream's limits, with times relative to now."""

    requests_left: int | None = None
    requests_reset_s: float | None = None
    tokens_left: int | None = None
    tokens_reset_s: float | None = None
    retry_after_s: float | None = None


_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_UNIT_S = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}


def parse_duration_s(value: str | None) -> float | None:
    """OpenAI's reset durations ("1s", "6m0s", "12ms", "1h2m3.5s") or plain seconds."""
    if value is None:
        return None
    text = value.strip().lower()
    if not text:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        pass
    parts = _DURATION_PART.findall(text)
    if not parts or "".join(n + u for n, u in parts) != text:
        return None
    return sum(float(number) * _UNIT_S[unit] for number, unit in parts)


def parse_retry_after_s(value: str | None, *, now: float | None = None) -> float | None:
    """Retry-After is delta-seconds or an HTTP date (RFC 9110 §10.2.3)."""
    if value is None or not value.strip():
        return None
    seconds = parse_duration_s(value)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(value.strip())
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(float(value)) if value is not None and value.strip() else None
    except ValueError:
        return None


def parse_rate_headers(headers: Mapping[str, str]) -> RateHeaders:
    lower = {k.lower(): v for k, v in headers.items()}
    retry_after_s = _retry_after_ms_s(lower.get("retry-after-ms"))
    if retry_after_s is None:
        retry_after_s = parse_retry_after_s(lower.get("retry-after"))
    return RateHeaders(
        requests_left=_int_or_none(lower.get("x-ratelimit-remaining-requests")),
        requests_reset_s=parse_duration_s(lower.get("x-ratelimit-reset-requests")),
        tokens_left=_int_or_none(lower.get("x-ratelimit-remaining-tokens")),
        tokens_reset_s=parse_duration_s(lower.get("x-ratelimit-reset-tokens")),
        retry_after_s=retry_after_s,
    )


def _retry_after_ms_s(value: str | None) -> float | None:
    """retry-after-ms (OpenAI's and Azure OpenAI's, to the millisecond), in seconds."""
    try:
        return max(0.0, float(value)) / 1000 if value is not None and value.strip() else None
    except ValueError:
        return None


def _blank(value) -> str:
    return "" if value is None else str(value)


class RateLimitTracker:
    """Proactive (configured rpm/tpm) and reactive (upstream headers, 429) limits of backends.

    `backend` arguments need `pk`, `rpm_limit`, `tpm_limit` and `rate_window_s`.
    """

    def __init__(self, client: redis.Redis, *, clock: Callable[[], float] | None = None):
        self.redis = client
        self.clock = clock
        self._reserve = registered_script(client, _RESERVE)
        self._reconcile = registered_script(client, _RECONCILE)
        self._extend = registered_script(client, _EXTEND_COOLDOWN)
        self._observe = registered_script(client, _OBSERVE)
        self._status = registered_script(client, _STATUS)

    @staticmethod
    def keys(backend_id: int) -> list[str]:
        base = f"renq:rl:{backend_id}"
        return [f"{base}:log", f"{base}:up", f"{base}:cool"]

    def _now(self) -> float:
        return self.clock() if self.clock is not None else -1.0

    def reserve(self, backend, tokens: int, *, check_only: bool = False) -> Reservation:
        """Take one request and `tokens` from every limit at once, or nothing at all."""
        tokens = max(0, int(tokens))
        reservation_id = uuid.uuid4().hex
        granted, reason, when = self._reserve(
            keys=self.keys(backend.pk),
            args=[
                self._now(),
                backend.rate_window_s,
                backend.rpm_limit,
                backend.tpm_limit,
                tokens,
                reservation_id,
                "1" if check_only else "0",
            ],
        )
        if int(granted):
            return Reservation(True, backend.pk, reservation_id, tokens)
        return Reservation(False, backend.pk, reason=reason.decode(), retry_at=float(when))

    def reconcile(self, reservation: Reservation, actual_tokens: int) -> None:
        """Replace the estimate with the real usage, so tpm counts what the upstream billed."""
        if reservation.granted and actual_tokens != reservation.tokens:
            self._reconcile(
                keys=self.keys(reservation.backend_id)[:1],
                args=[reservation.reservation_id, reservation.tokens, max(0, int(actual_tokens))],
            )

    def release(self, reservation: Reservation) -> None:
        """The call was never sent: give the request back."""
        if reservation.granted:
            member = f"{reservation.reservation_id}:{reservation.tokens}"
            self.redis.zrem(self.keys(reservation.backend_id)[0], member)

    def extend_cooldown(self, backend_id: int, seconds: float) -> float:
        """Cool the backend down for `seconds` unless a longer cooldown is already in force.
        Returns the cooldown-until in force."""
        seconds = min(max(0.0, seconds), MAX_COOLDOWN_S)
        return float(self._extend(keys=self.keys(backend_id)[2:], args=[self._now(), seconds]))

    def observe(self, backend_id: int, headers: Mapping[str, str], status_code: int) -> RateHeaders:
        """Learn from every response's headers; a 429 starts (or extends) a cooldown until
        the latest of retry-after and the reported reset times."""
        seen = parse_rate_headers(headers)
        if seen.requests_left is not None or seen.tokens_left is not None:
            self._observe(
                keys=self.keys(backend_id)[1:2],
                args=[
                    self._now(),
                    _blank(seen.requests_left),
                    _blank(seen.requests_reset_s if seen.requests_left is not None else None),
                    _blank(seen.tokens_left),
                    _blank(seen.tokens_reset_s if seen.tokens_left is not None else None),
                ],
            )
        if status_code == 429:
            waits = [seen.retry_after_s]
            if seen.requests_left == 0:
                waits.append(seen.requests_reset_s)
            if seen.tokens_left == 0:
                waits.append(seen.tokens_reset_s)
            known = [w for w in waits if w is not None]
            self.extend_cooldown(backend_id, max(known) if known else DEFAULT_429_COOLDOWN_S)
        return seen

    def status(self, backend) -> LimitStatus:
        now, cool, count, used, req_left, req_reset, tok_left, tok_reset = (
            v.decode() if isinstance(v, bytes) else v
            for v in self._status(
                keys=self.keys(backend.pk), args=[self._now(), backend.rate_window_s]
            )
        )
        now_f = float(now)
        return LimitStatus(
            now=now_f,
            cooldown_until=float(cool) if cool else 0.0,
            requests_in_window=int(count),
            tokens_in_window=int(used),
            upstream_requests_left=(
                int(req_left) if req_left and req_reset and float(req_reset) > now_f else None
            ),
            upstream_tokens_left=(
                int(tok_left) if tok_left and tok_reset and float(tok_reset) > now_f else None
            ),
        )

    def headroom(self, backend, tokens: int = 0) -> float:
        """0 (would be refused) … 1 (untouched): the smallest share left of any limit."""
        status = self.status(backend)
        if status.cooling_down:
            return 0.0
        shares = [1.0]
        if backend.rpm_limit:
            shares.append(1 - (status.requests_in_window + 1) / backend.rpm_limit)
        if backend.tpm_limit and status.requests_in_window:
            shares.append(1 - (status.tokens_in_window + tokens) / backend.tpm_limit)
        if status.upstream_requests_left is not None and status.upstream_requests_left < 1:
            shares.append(-1.0)
        if status.upstream_tokens_left is not None and status.upstream_tokens_left < tokens:
            shares.append(-1.0)
        # The last request in the window leaves 0 after it but is still allowed.
        least = min(shares)
        return 0.0 if least < 0 else max(least, 1e-3)
