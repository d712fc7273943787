"""A taken head start handed over: the idle worker that took a realtime job's offer runs,
claims and stores that job itself, and the job gets no message.

The message of a job whose pass already runs from its head start exists only to tell a
worker that the job is committed, and its chain (publish, confirm, delivery, Celery's parent,
the pool's IPC, the ack) costs the stack more CPU than anything else left on an idle realtime
request. So the two sides agree in Redis, each step one atomic command or script:

1. the worker that starts an offered pass marks it taken (`take`: SET NX);
2. the submitter, once the job is committed, answers (`answer_takers`): to a taken mark it
   says "yours" when the job's tenant has no work ahead of its queue's virtual time (the
   worker serves it as its turn), "no" otherwise; a job nobody took is marked published, so
   nobody takes it later. It publishes every job it did not hand over;
3. the worker waits a bounded time for the answer (`await_answer`); with "yours" it claims,
   runs and stores the job as a run would, with anything else its pass waits for the
   message as any head start. A worker that waits in vain marks the job abandoned in the
   same script that finds no answer, so a submitter that answers later publishes instead.

Nothing accepted is lost: a job handed over is committed before its worker claims it; a
worker that dies before its claim leaves a queued job with no message, which the lost-message
sweep publishes (workers.sweeper.republish_lost_messages); one that dies after has its lease
taken over. Redis away means no handover: every job is published.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import redis

from routing.redis_scripts import registered_script

logger = logging.getLogger(__name__)

_PREFIX = "renq:handover:"
# Long past any submit: the marks only order the two sides of one job.
MARK_TTL_MS = 60_000
TAKEN, YOURS = b"taken", b"yours"

# KEYS per job: its mark, its answer list. ARGV: the marks' ttl, then per job '1' when the
# worker that took it may serve it. Returns per job 1 (handed over) or 0 (publish it).
_ANSWER_TAKERS = """
local out = {}
for i = 1, #KEYS, 2 do
  local mark = redis.call('GET', KEYS[i])
  local handed = 0
  if mark == 'taken' then
    local answer = 'no'
    if ARGV[1 + (i + 1) / 2] == '1' then answer = 'yours'; handed = 1 end
    redis.call('RPUSH', KEYS[i + 1], answer)
    redis.call('PEXPIRE', KEYS[i + 1], ARGV[1])
    redis.call('SET', KEYS[i], answer, 'PX', ARGV[1])
  elseif not mark then
    redis.call('SET', KEYS[i], 'published', 'PX', ARGV[1])
  end
  out[#out + 1] = handed
end
return out
"""

# KEYS: the job's mark, its answer list. ARGV: the mark's ttl. The answer if one came, else
# the job is marked abandoned (its submitter then publishes it) and nothing is returned.
_ABANDON = """
local answer = redis.call('LPOP', KEYS[2])
if answer then return answer end
redis.call('SET', KEYS[1], 'abandoned', 'PX', ARGV[1])
return false
"""


def mark_key(job_id: str) -> str:
    """The Redis key of the job's mark: taken, published, yours, no or abandoned."""
    return f"{_PREFIX}{job_id}"


def _answer_key(job_id: str) -> str:
    return f"{_PREFIX}{job_id}:answer"


def take(client: redis.Redis, job_id: str) -> bool:
    """The worker's step: mark the job's head start taken; False when its submitter has
    answered already (it publishes the job), or Redis cannot be reached."""
    try:
        return bool(client.set(mark_key(job_id), TAKEN, nx=True, px=MARK_TTL_MS))
    except redis.RedisError:
        logger.debug("head start of job %s not taken", job_id, exc_info=True)
        return False


def await_answer(client: redis.Redis, job_id: str, timeout_s: float) -> bool:
    """The worker's step after `take`: whether the job is handed over to it, waiting up to
    `timeout_s` for its submitter's answer. False after a Redis error: the job is then
    published (no answer reached the submitter's side) or left to the lost-message sweep."""
    answer_key = _answer_key(job_id)
    try:
        popped = client.blpop([answer_key], timeout=timeout_s)
        if popped is None:
            answer = client.register_script(_ABANDON)(
                keys=[mark_key(job_id), answer_key], args=[MARK_TTL_MS]
            )
        else:
            answer = popped[1]
    except redis.RedisError:
        logger.warning("no handover answer for job %s", job_id, exc_info=True)
        return False
    return answer == YOURS


def answer_takers(client: redis.Redis, servable: Mapping[str, bool]) -> set[str]:
    """The submitter's step, once the jobs are committed: per job id, whether a worker that
    took its head start may serve it. Returns the ids handed over (not to publish); none when
    Redis cannot be reached."""
    if not servable:
        return set()
    ids = list(servable)
    keys = [key for job_id in ids for key in (mark_key(job_id), _answer_key(job_id))]
    args = [MARK_TTL_MS] + ["1" if servable[job_id] else "0" for job_id in ids]
    try:
        handed = registered_script(client, _ANSWER_TAKERS)(keys=keys, args=args)
    except redis.RedisError:
        logger.warning("head starts not handed over; publishing %d jobs", len(ids))
        return set()
    return {job_id for job_id, flag in zip(ids, handed, strict=True) if int(flag)}
