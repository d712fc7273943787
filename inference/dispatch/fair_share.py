"""Fair queuing between the tenants of one tier queue: start-time fair queuing (SFQ; Goyal,
Vin and Cheng, 1996) mapped onto RabbitMQ's message priorities, its tags kept in Redis so
every publisher and worker of a queue shares one virtual clock.

A message's start tag is S = max(V, F), V being the queue's virtual time (the largest start
tag a worker has taken from it) and F the tenant's finish tag; F then moves to
S + cost / weight, the cost being the message's estimated tokens and the weight the tenant's
plan weight. RabbitMQ serves a priority queue highest level first and in arrival order within
a level, so the message's priority is its band: how far S lies ahead of V, in quanta of one
batch's work (under one quantum: the top level; then bands that double; the rest at the
bottom). The quantum is the queue's, the same for every tenant (a batch of the queue's mean
job, kept beside the clock), so that the bands order every tenant's messages by S alike: a
quantum sized by each tenant's own jobs sank the tenants with small jobs first. A tenant
without a backlog starts at V and lands on the top level behind at most about one quantum of
each other tenant's work, while a flood's later messages sink.
A lower level is served whenever nothing waits above it, so the share is work-conserving: a
lone tenant gets the whole worker.

Redis is the shared state, not the record: if it cannot be reached, messages go out at the
plan's static priority and nothing is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from redis.commands.core import Script

from renq_site.shared_redis import shared_redis

logger = logging.getLogger(__name__)

# The message header that carries a message's start tag to the worker that takes it.
START_TAG_HEADER = "renq_fair_start"
# A tenant idle this long starts afresh (its finish tag expires); longer than any backlog.
TAG_TTL_S = 6 * 3600
_PREFIX = "renq:fair:"

# KEYS: (virtual time, tenant finish tag, queue's mean job tokens) per message; ARGV: ttl,
# then each message's (charge, tokens per job). Returns each message's start tag, the virtual
# time it was read against and the queue's mean job tokens, this message's included.
# How fast a queue's mean job size follows its messages (a moving average over ~20).
MEAN_STEP = 0.05
_TAG_MESSAGES = """
local ttl = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS, 3 do
  local m = (i - 1) / 3
  local v = tonumber(redis.call('GET', KEYS[i]) or '0')
  local f = tonumber(redis.call('GET', KEYS[i + 1]) or '0')
  local s = math.max(v, f)
  redis.call('SET', KEYS[i + 1], tostring(s + tonumber(ARGV[2 + 2 * m])), 'EX', ttl)
  local per_job = tonumber(ARGV[3 + 2 * m])
  local mean = tonumber(redis.call('GET', KEYS[i + 2]) or '0')
  if mean <= 0 then mean = per_job else mean = mean + MEAN_STEP * (per_job - mean) end
  redis.call('SET', KEYS[i + 2], tostring(mean), 'EX', ttl)
  out[#out + 1] = tostring(s)
  out[#out + 1] = tostring(v)
  out[#out + 1] = tostring(mean)
end
return out
""".replace("MEAN_STEP", repr(MEAN_STEP))

# KEYS: virtual times; ARGV: the start tag taken from each. The clock only moves forward.
_ADVANCE = """
for i = 1, #KEYS do
  local v = tonumber(redis.call('GET', KEYS[i]) or '0')
  if tonumber(ARGV[i]) > v then redis.call('SET', KEYS[i], ARGV[i]) end
end
return #KEYS
"""

_scripts: dict[int, tuple[redis.Redis, Script, Script]] = {}


def _script_pair(client: redis.Redis) -> tuple[Script, Script]:
    cached = _scripts.get(id(client))
    if cached is None or cached[0] is not client:
        cached = (client, client.register_script(_TAG_MESSAGES), client.register_script(_ADVANCE))
        _scripts[id(client)] = cached
    return cached[1], cached[2]


@dataclass(frozen=True)
class Charge:
    """One message to tag: its queue, its tenant, and the work it carries."""

    queue: str
    tenant_id: int
    tokens: int
    jobs: int  # the jobs the message carries
    weight: float
    batch_jobs: int  # the service's batch_size
    batch_tokens: int  # the service's token budget of a batch


@dataclass(frozen=True)
class Tag:
    start: float
    priority: int


def band(ahead: float, quantum: float, top: int) -> int:
    """The priority of a message whose start lies `ahead` of the virtual time: `top` under one
    quantum, then one level lower each time the distance doubles, 0 at the bottom."""
    level, limit = top, max(quantum, 1e-9)
    while level > 0 and ahead >= limit:
        level -= 1
        limit *= 2
    return level


def tag_messages(charges: Sequence[Charge], *, top: int) -> list[Tag] | None:
    """Start tags and priorities for messages about to be published, in one Redis round trip.
    None when Redis cannot be reached (the caller publishes at the static priority)."""
    if not charges:
        return []
    keys: list[str] = []
    args: list[float] = [TAG_TTL_S]
    for charge in charges:
        keys += [
            _clock_key(charge.queue),
            f"{_PREFIX}{charge.queue}:f:{charge.tenant_id}",
            f"{_PREFIX}{charge.queue}:mean",
        ]
        args += [
            max(1, charge.tokens) / max(charge.weight, 1e-6),
            max(1.0, charge.tokens / max(1, charge.jobs)),
        ]
    try:
        tag_script, _ = _script_pair(shared_redis())
        values = tag_script(keys=keys, args=args)
    except redis.RedisError:
        logger.warning("fair share: tags unavailable; publishing at static priorities")
        return None
    tags = []
    for i, charge in enumerate(charges):
        start, clock, mean = (float(value) for value in values[3 * i : 3 * i + 3])
        quantum = min(charge.batch_tokens, charge.batch_jobs * mean)
        tags.append(Tag(start, band(start - clock, quantum, top)))
    return tags


def advance(taken: dict[str, float]) -> None:
    """A worker took messages with these start tags (queue → the largest): the queues'
    virtual time moves up to them. Never raises: a missed move only delays the clock."""
    if not taken:
        return
    queues = sorted(taken)
    try:
        _, advance_script = _script_pair(shared_redis())
        advance_script(
            keys=[_clock_key(q) for q in queues], args=[repr(taken[q]) for q in queues]
        )
    except redis.RedisError:
        logger.warning("fair share: could not move the virtual time of %s", queues)


def _clock_key(queue: str) -> str:
    return f"{_PREFIX}{queue}:v"
