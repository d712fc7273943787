"""Fair queuing between the tenants of one tier queue: start-time fair queuing (SFQ; Goyal,
Vin and Cheng, 1996) over RabbitMQ's queues, its tags kept in Redis so every publisher and
worker of a queue shares one virtual clock.

A message's start tag is S = max(V, F), V being the queue's virtual time (the largest start
tag a worker has taken from it) and F the tenant's finish tag; F then moves to
S + cost / weight, the cost being the message's estimated tokens and the weight the tenant's
plan weight. The quantum is the queue's, the same for every tenant: a batch of the queue's
mean job, kept beside the clock (one sized by each tenant's own jobs favoured large jobs).

RabbitMQ serves a priority queue highest level first and in arrival order within a level, and
a message's level is fixed once it is out. So a submission to a worker tier queue below
realtime whose start lies HOLD_AT quanta or more beyond V, or beyond work already held, is
held back: its jobs wait in Postgres with their start tag, and workers release the held start
tags a few quanta at a time as V nears them (publishing.release_held), two levels under the
top. What RabbitMQ holds there lies within a few quanta of start tags, where arrival order is
close to start-tag order; a submission that starts that close goes out at that level at once,
as its release would send it. A submission that starts within a quantum of V goes one level
under the top, ahead of the released work: among it, it would wait for all of it, up to the
few quanta released. A
tenant with no work ahead of V starts at V, before all of them, and goes at the top level: it
waits for the pass that runs, not for the others' backlogs. A queue that runs short gets the
next start tags at once, so the share is work-conserving: a lone tenant gets the whole worker.

Messages that are not held (realtime, cloud calls, work published again) go at a band: the top
level under one quantum ahead of V, then one level lower each time the distance doubles.
Redis is the shared state, not the record: if it cannot be reached, messages go out at the
plan's static priority and nothing is held; nothing is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import redis
from redis.commands.core import Script

from renq_site.shared_redis import shared_redis
from routing.redis_scripts import registered_script

logger = logging.getLogger(__name__)

# The message header that carries a message's start tag to the worker that takes it.
START_TAG_HEADER = "renq_fair_start"
# Set on a message whose tenant had no work ahead of the virtual time: a worker lets it into a
# batch formed before it came (DrainLoop.fresh_first).
FRESH_HEADER = "renq_fair_fresh"
# A tenant idle this long starts afresh (its finish tag expires); longer than any backlog.
TAG_TTL_S = 6 * 3600
_PREFIX = "renq:fair:"

# How fast a queue's mean job size follows its messages (a moving average over ~20).
MEAN_STEP = 0.05
# A submission starting this many quanta or more beyond the virtual time goes under the top
# level; held work is released once its earliest start tag is within this of V.
HOLD_AHEAD = 1.0
# A submission starting this many quanta or more beyond the virtual time is held back (as is
# one starting beyond held work); one closer goes out at the released work's level, which
# the release window (RELEASE_QUANTA past V) fills anyway, without a hold, a release and a
# publish stamp written per job.
HOLD_AT = 3.0
# Released work goes this many levels under the top (publishing.RELEASED_PRIORITY).
RELEASED_BELOW_TOP = 2
# A queue no worker has taken from for this long holds nothing back: no take would come to
# release it (no worker yet, or one stuck in a long pass), and the sweeper's backstop is slow.
TAKEN_RECENTLY_S = 5

# KEYS per message: virtual time, tenant finish tag, the queue's mean job tokens, its quantum,
# its earliest held start tag, its taken-recently mark. ARGV: ttl, then per message: charge,
# tokens per job, batch_size, batch token budget, whether it may be held (1/0). Returns per
# message: its start tag, the virtual time read, the quantum, and 0 (banded: not holdable, or
# nobody takes from its queue), 1 (within a quantum of V), 2 (held) or 3 (at the released
# work's level).
_TAG_MESSAGES = (
    """
local ttl = tonumber(ARGV[1])
local out = {}
for i = 1, #KEYS, 6 do
  local m = (i - 1) / 6
  local a = 2 + 5 * m
  local v = tonumber(redis.call('GET', KEYS[i]) or '0')
  local f = tonumber(redis.call('GET', KEYS[i + 1]) or '0')
  local s = math.max(v, f)
  redis.call('SET', KEYS[i + 1], tostring(s + tonumber(ARGV[a])), 'EX', ttl)
  local per_job = tonumber(ARGV[a + 1])
  local mean = tonumber(redis.call('GET', KEYS[i + 2]) or '0')
  if mean <= 0 then mean = per_job else mean = mean + MEAN_STEP * (per_job - mean) end
  redis.call('SET', KEYS[i + 2], tostring(mean), 'EX', ttl)
  local quantum = math.max(math.min(tonumber(ARGV[a + 3]), tonumber(ARGV[a + 2]) * mean), 1)
  redis.call('SET', KEYS[i + 3], tostring(quantum), 'EX', ttl)
  local holding = 0
  if ARGV[a + 4] == '1' and redis.call('EXISTS', KEYS[i + 5]) == 1 then
    holding = 1
    if s - v >= HOLD_AHEAD * quantum then
      local earliest = tonumber(redis.call('GET', KEYS[i + 4]) or 'inf')
      if s - v >= HOLD_AT * quantum or s >= earliest then
        if s < earliest then redis.call('SET', KEYS[i + 4], tostring(s), 'EX', ttl) end
        holding = 2
      else
        holding = 3
      end
    end
  end
  out[#out + 1] = tostring(s)
  out[#out + 1] = tostring(v)
  out[#out + 1] = tostring(quantum)
  out[#out + 1] = tostring(holding)
end
return out
""".replace("MEAN_STEP", repr(MEAN_STEP))
    .replace("HOLD_AHEAD", repr(HOLD_AHEAD))
    .replace("HOLD_AT", repr(HOLD_AT))
)

# KEYS per queue: virtual time, quantum, earliest held start tag, taken-recently mark, holds
# count, idle mark. ARGV: the mark's ttl, whether the caller's run ends ('1': its worker goes
# idle, so a hold committed from now on must be released by its sender), then per queue the
# start tag taken ('' when none). The clock only moves forward; a take clears the idle mark.
# Returns per queue: the virtual time, the quantum, the earliest held start tag (''), the
# holds count.
_ADVANCE = """
local out = {}
for i = 1, #KEYS, 6 do
  local taken = ARGV[3 + (i - 1) / 6]
  local v = tonumber(redis.call('GET', KEYS[i]) or '0')
  if taken ~= '' then
    if tonumber(taken) > v then
      v = tonumber(taken)
      redis.call('SET', KEYS[i], taken)
    end
    redis.call('SET', KEYS[i + 3], '1', 'EX', tonumber(ARGV[1]))
    redis.call('DEL', KEYS[i + 5])
  elseif ARGV[2] == '1' then
    redis.call('SET', KEYS[i + 5], '1', 'EX', TAG_TTL_S)
  end
  out[#out + 1] = tostring(v)
  out[#out + 1] = redis.call('GET', KEYS[i + 1]) or '1'
  out[#out + 1] = redis.call('GET', KEYS[i + 2]) or ''
  out[#out + 1] = redis.call('GET', KEYS[i + 4]) or '0'
end
return out
""".replace("TAG_TTL_S", repr(TAG_TTL_S))

# KEYS: the queue's earliest held start tag, its holds count. ARGV: the count the release
# read before it looked in Postgres ('' unknown), the earliest start tag it left held ('' none).
# A hold committed since may be one the release did not see: then the note only moves down.
_NOTE_HELD = """
local unchanged = ARGV[1] ~= '' and (redis.call('GET', KEYS[2]) or '0') == ARGV[1]
if unchanged then
  if ARGV[2] == '' then redis.call('DEL', KEYS[1])
  else redis.call('SET', KEYS[1], ARGV[2], 'EX', TAG_TTL_S) end
elseif ARGV[2] ~= '' then
  local noted = tonumber(redis.call('GET', KEYS[1]) or 'inf')
  if tonumber(ARGV[2]) < noted then redis.call('SET', KEYS[1], ARGV[2], 'EX', TAG_TTL_S) end
end
return 1
""".replace("TAG_TTL_S", repr(TAG_TTL_S))

# KEYS per queue: earliest held start tag, holds count, idle mark. ARGV per queue: the earliest
# start tag just held back (committed). Notes it (the note only moves down), counts the holds,
# and returns per queue whether its workers went idle ('1').
_HOLDS_COMMITTED = """
local out = {}
for i = 1, #KEYS, 3 do
  local start = ARGV[(i + 2) / 3]
  local noted = tonumber(redis.call('GET', KEYS[i]) or 'inf')
  if tonumber(start) < noted then redis.call('SET', KEYS[i], start, 'EX', TAG_TTL_S) end
  redis.call('INCR', KEYS[i + 1])
  redis.call('EXPIRE', KEYS[i + 1], TAG_TTL_S)
  out[#out + 1] = redis.call('GET', KEYS[i + 2]) or '0'
end
return out
""".replace("TAG_TTL_S", repr(TAG_TTL_S))

_SOURCES = {
    "tag": _TAG_MESSAGES,
    "advance": _ADVANCE,
    "note_held": _NOTE_HELD,
    "holds_committed": _HOLDS_COMMITTED,
}


def _script(name: str) -> Script:
    return registered_script(shared_redis(), _SOURCES[name])


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
    holdable: bool = False  # a first publish to a worker tier queue below realtime


@dataclass(frozen=True)
class Tag:
    start: float
    priority: int
    held: bool = False  # too far ahead of its queue's virtual time: held back, not published
    fresh: bool = False  # its tenant had no work ahead: it starts at the virtual time


@dataclass(frozen=True)
class Clock:
    """A queue's virtual time, its quantum, the earliest start tag held back from it, and
    how many holds were committed (a release that saw this count can tell whether one
    committed while it looked)."""

    virtual_time: float
    quantum: float
    earliest_held: float | None
    holds: int

    @property
    def release_due(self) -> bool:
        """Held work's turn is near: the earliest held start tag is within HOLD_AHEAD quanta."""
        return (
            self.earliest_held is not None
            and self.earliest_held - self.virtual_time < HOLD_AHEAD * self.quantum
        )


def band(ahead: float, quantum: float, top: int) -> int:
    """The priority of a message whose start lies `ahead` of the virtual time: `top` under one
    quantum, then one level lower each time the distance doubles, 0 at the bottom."""
    level, limit = top, max(quantum, 1e-9)
    while level > 0 and ahead >= limit:
        level -= 1
        limit *= 2
    return level


def tag_messages(charges: Sequence[Charge], *, top: int) -> list[Tag] | None:
    """Start tags and priorities for messages about to be published, in one Redis round trip;
    a holdable message too far ahead of its queue's virtual time is marked held. None when
    Redis cannot be reached (the caller publishes at the static priority)."""
    if not charges:
        return []
    keys: list[str] = []
    args: list[float | int] = [TAG_TTL_S]
    for charge in charges:
        queue = charge.queue
        keys += [
            _key(queue, "v"),
            f"{_PREFIX}{queue}:f:{charge.tenant_id}",
            _key(queue, "mean"),
            _key(queue, "quantum"),
            _key(queue, "held"),
            _key(queue, "taken"),
        ]
        args += [
            max(1, charge.tokens) / max(charge.weight, 1e-6),
            max(1.0, charge.tokens / max(1, charge.jobs)),
            charge.batch_jobs,
            charge.batch_tokens,
            int(charge.holdable),
        ]
    try:
        values = _script("tag")(keys=keys, args=args)
    except redis.RedisError:
        logger.warning("fair share: tags unavailable; publishing at static priorities")
        return None
    tags = []
    for i in range(len(charges)):
        start, clock, quantum, holding = (float(value) for value in values[4 * i : 4 * i + 4])
        if holding == 3:
            priority = top - RELEASED_BELOW_TOP
        elif holding:
            # Within a quantum of V, or held: a tenant with no work ahead of V (its start is
            # V) goes first, the others ahead of the released work, in arrival order.
            priority = top if start <= clock else top - 1
        else:
            priority = band(start - clock, quantum, top)
        tags.append(Tag(start, priority, held=holding == 2, fresh=start <= clock))
    return tags


def advance(taken: dict[str, float | None], *, going_idle: bool = False) -> dict[str, Clock]:
    """A worker took messages with these start tags (queue → the largest; None: it took none
    there, and asks only how the queue stands): the queues' virtual time moves up to them.
    `going_idle`: the worker's run ends, so it takes no more from the queues it took none
    from until a message comes; a hold committed after this is released by its sender
    (holds_committed). Returns each queue's clock; empty when Redis cannot be reached (a
    missed move only delays the clock)."""
    if not taken:
        return {}
    queues = sorted(taken)
    keys = [
        key
        for q in queues
        for key in (
            _key(q, "v"),
            _key(q, "quantum"),
            _key(q, "held"),
            _key(q, "taken"),
            _key(q, "holds"),
            _key(q, "idle"),
        )
    ]
    args = [TAKEN_RECENTLY_S, "1" if going_idle else "0"]
    args += ["" if taken[q] is None else repr(taken[q]) for q in queues]
    try:
        values = _script("advance")(keys=keys, args=args)
    except redis.RedisError:
        logger.warning("fair share: could not move the virtual time of %s", queues)
        return {}
    clocks = {}
    for i, queue in enumerate(queues):
        virtual_time, quantum, earliest, holds = values[4 * i : 4 * i + 4]
        clocks[queue] = Clock(
            float(virtual_time),
            float(quantum),
            float(earliest) if earliest else None,
            int(holds),
        )
    return clocks


def note_held(queue: str, earliest: float | None, *, holds_seen: int | None) -> None:
    """After a release: the earliest start tag it left held back from the queue (None: none).
    `holds_seen`: the queue's holds count read before the release looked in Postgres (None:
    unknown). A hold committed since may be one it did not see, so then the note is only
    lowered, never cleared: cleared, that hold would wait for the sweeper. Never raises: a
    wrong note only makes a worker look in Postgres once for nothing."""
    keys = [_key(queue, "held"), _key(queue, "holds")]
    args = [
        "" if holds_seen is None else str(holds_seen),
        "" if earliest is None else repr(earliest),
    ]
    try:
        _script("note_held")(keys=keys, args=args)
    except redis.RedisError:
        logger.warning("fair share: could not note what %s holds back", queue)


def holds_committed(starts: dict[str, float]) -> set[str]:
    """Holds just committed (queue → their earliest start tag): noted again, since a release
    that looked before the commit may have cleared the note their tags set, and counted.
    Returns the queues whose workers went idle meanwhile: nobody takes from them to release
    the work, so the caller releases it. Empty when Redis cannot be reached (the sweeper
    releases it then)."""
    if not starts:
        return set()
    queues = sorted(starts)
    keys = [k for q in queues for k in (_key(q, "held"), _key(q, "holds"), _key(q, "idle"))]
    try:
        idle = _script("holds_committed")(keys=keys, args=[repr(starts[q]) for q in queues])
    except redis.RedisError:
        logger.warning("fair share: could not note the holds of %s", queues)
        return set()
    return {queue for queue, flag in zip(queues, idle, strict=True) if flag == b"1"}


def clock(queue: str) -> Clock | None:
    """The queue's clock, read without moving it (None when Redis cannot be reached)."""
    return advance({queue: None}).get(queue)


def _key(queue: str, name: str) -> str:
    return f"{_PREFIX}{queue}:{name}"
