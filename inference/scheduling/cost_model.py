"""How long a batch will take, learned online per service and device: the batch former's
tool for bounded preemption.

    predicted_s = per_batch_s + per_token_s × padded tokens

Both coefficients are moving averages of what the workers of a service on one kind of device
measured (shared in Redis, so a new worker starts with its peers' knowledge): every batch
updates `per_token_s` from (elapsed − per_batch_s) / tokens, and the warm-up pass (one tiny
batch) seeds `per_batch_s`. Padded tokens are estimated as the job tokens × (1 + the engine's
padding allowance), since length bucketing keeps padding under that ratio.

Preemption in a serving system happens at dispatch: a forward pass is not interrupted. So a
realtime job that arrives while a batch runs waits for that batch to end; keeping every
non-realtime batch's predicted time under the service's preemption budget is what bounds
that wait.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

import redis

from renq_site.shared_redis import shared_redis
from routing.redis_scripts import registered_script
from routing.stats import KeptSamples

logger = logging.getLogger(__name__)

# Weight of the newest sample: ~10 batches dominate, so a change of load shows within seconds.
EWMA_ALPHA = 0.2
# Until a service has been measured: a slow CPU's cost (seconds per padded token, per batch),
# so its first batches err short rather than long; the first real batch replaces it.
PRIOR_PER_TOKEN_S = 1e-4
PRIOR_PER_BATCH_S = 0.005
# Padding allowance when the engine does not say (inference.engines.base.Engine).
DEFAULT_PADDING_RATIO = 0.25

# KEYS[1]: the model. ARGV: the priors (per token, per batch), alpha, the epoch the
# observations were made against ('': any), an epoch for a model made now, then each
# observation as (elapsed_s, tokens, 'tokens' | 'batch'), oldest first. An epoch names one
# life of the model: observations made against one that was deleted since are dropped.
_UPDATE = """
local h = redis.call('HMGET', KEYS[1], 'per_token_s', 'per_batch_s', 'samples', 'epoch')
local per_token = tonumber(h[1] or ARGV[1])
local per_batch = tonumber(h[2] or ARGV[2])
local samples = tonumber(h[3] or 0)
local epoch = h[4]
local alpha = tonumber(ARGV[3])
if #ARGV > 5 and (ARGV[4] == '' or ARGV[4] == epoch) then
  local measured = h[1]
  for i = 6, #ARGV, 3 do
    local elapsed = tonumber(ARGV[i])
    if ARGV[i + 2] == 'batch' then
      per_batch = alpha * elapsed + (1 - alpha) * per_batch
    else
      local sample = math.max(0, elapsed - per_batch) / math.max(1, tonumber(ARGV[i + 1]))
      if measured then per_token = alpha * sample + (1 - alpha) * per_token
      else per_token = sample end
    end
    measured = true
  end
  epoch = epoch or ARGV[5]
  redis.call('HSET', KEYS[1], 'per_token_s', tostring(per_token), 'per_batch_s',
             tostring(per_batch), 'epoch', epoch)
  samples = redis.call('HINCRBY', KEYS[1], 'samples', (#ARGV - 5) / 3)
end
return {tostring(per_token), tostring(per_batch), samples, epoch or ''}
"""

# One observation: (elapsed_s, tokens, "tokens" for a batch's pass, "batch" for the warm-up's).
Observation = tuple[float, int, str]


@dataclass(frozen=True)
class BatchCost:
    per_token_s: float
    per_batch_s: float
    samples: int

    def predict_s(self, tokens: int, *, padding_ratio: float = DEFAULT_PADDING_RATIO) -> float:
        return self.per_batch_s + self.per_token_s * tokens * (1 + padding_ratio)

    def tokens_within(self, budget_s: float, *, padding_ratio: float = DEFAULT_PADDING_RATIO):
        """The most job tokens a batch may hold to stay within `budget_s`."""
        spare = max(0.0, budget_s - self.per_batch_s)
        return int(spare / (self.per_token_s * (1 + padding_ratio))) if self.per_token_s else 0

    def observed(self, elapsed_s: float, tokens: int, which: str) -> BatchCost:
        """This model after one more observation: the script's arithmetic (_UPDATE)."""
        if which == "batch":
            per_batch = EWMA_ALPHA * elapsed_s + (1 - EWMA_ALPHA) * self.per_batch_s
            return BatchCost(self.per_token_s, per_batch, self.samples + 1)
        sample = max(0.0, elapsed_s - self.per_batch_s) / max(1, tokens)
        per_token = (
            EWMA_ALPHA * sample + (1 - EWMA_ALPHA) * self.per_token_s if self.samples else sample
        )
        return BatchCost(per_token, self.per_batch_s, self.samples + 1)


# This process's observations not sent yet, shared by its BatchCostModels (a worker makes one
# per task), and the epoch of each model as last seen: what was kept against another is dropped.
_unsent: KeptSamples[Observation] = KeptSamples()
_epochs: dict[str, str] = {}


def _seen(key: str, epoch: str) -> None:
    if _epochs.get(key, epoch) != epoch:
        _unsent.drop(key)
    _epochs[key] = epoch


class BatchCostModel:
    """`reuse_s`: how long one read of the model is reused (the worker loop reads it twice a
    batch, and a Redis round trip each would sit on an idle realtime job's path). The
    process's own observations are in its predictions at once and reach Redis together at
    most once per `reuse_s` (a round trip per batch would be one per idle realtime request);
    other workers' are seen within `reuse_s`. With `reuse_s` 0, each read and each
    observation is a round trip."""

    def __init__(
        self,
        service_name: str,
        device: str,
        client: redis.Redis | None = None,
        *,
        reuse_s: float = 0.0,
    ):
        self.key = f"renq:cost:{service_name}:{device}"
        self._client = client
        self.reuse_s = reuse_s
        self._read: tuple[float, BatchCost] | None = None

    @property
    def redis(self) -> redis.Redis:
        return self._client or shared_redis()

    def current(self) -> BatchCost:
        if self._read is not None and time.monotonic() - self._read[0] < self.reuse_s:
            return self._read[1]
        try:
            stored = self.redis.hgetall(self.key)
        except redis.RedisError:
            stored = {}
        else:
            _seen(self.key, stored.get(b"epoch", b"").decode())
        cost = BatchCost(
            per_token_s=float(stored.get(b"per_token_s", PRIOR_PER_TOKEN_S)),
            per_batch_s=float(stored.get(b"per_batch_s", PRIOR_PER_BATCH_S)),
            samples=int(stored.get(b"samples", 0)),
        )
        if self.reuse_s > 0:
            for observation in _unsent.kept(self.key):  # this process's, not sent yet
                cost = cost.observed(*observation)
            self._read = (time.monotonic(), cost)
        return cost

    @classmethod
    def measured(cls, service_name: str) -> dict[str, BatchCost]:
        """The model of every device the service's workers have measured, by device."""
        prefix = f"renq:cost:{service_name}:"
        try:
            keys = list(shared_redis().scan_iter(match=f"{prefix}*", count=100))
        except redis.RedisError:
            return {}
        devices = [key.decode()[len(prefix) :] for key in keys]
        return {device: cls(service_name, device).current() for device in sorted(devices)}

    def observe_batch(self, elapsed_s: float, tokens: int) -> None:
        self._observe((elapsed_s, tokens, "tokens"))

    def observe_overhead(self, elapsed_s: float) -> None:
        """A tiny batch (the warm-up pass): nearly all of it is per-batch overhead."""
        self._observe((elapsed_s, 0, "batch"))

    def _observe(self, observation: Observation) -> None:
        if self.reuse_s <= 0:
            self._read = None
            self._send([observation], "")
        elif due := _unsent.add(self.key, observation, self.reuse_s):
            self._send(due, _epochs.get(self.key, ""))
        elif self._read is not None:
            self._read = (self._read[0], self._read[1].observed(*observation))

    def _send(self, observations: list[Observation], epoch: str) -> BatchCost | None:
        """Add `observations` (made against `epoch`) to the stored model in one round trip;
        returns the model stored now (None: Redis could not be reached, and they are lost)."""
        args: list = [PRIOR_PER_TOKEN_S, PRIOR_PER_BATCH_S, EWMA_ALPHA, epoch, uuid.uuid4().hex]
        for observation in observations:
            args.extend(observation)
        try:
            per_token_s, per_batch_s, samples, stored_epoch = registered_script(
                self.redis, _UPDATE
            )(keys=[self.key], args=args)
        except redis.RedisError:
            # A statistic: a lost sample must not cost a batch its results.
            logger.warning("could not update the batch cost model %s", self.key, exc_info=True)
            return None
        _seen(self.key, stored_epoch.decode())
        cost = BatchCost(float(per_token_s), float(per_batch_s), int(samples))
        if self.reuse_s > 0:
            # The script answers with what it stored: the next read needs no round trip.
            self._read = (time.monotonic(), cost)
        return cost


# The batch former aims non-realtime passes at this fraction of the preemption budget: the
# budget bounds a realtime job's whole wait, which is the pass it finds running plus its own
# dispatch (publish, pull, claim), and a pass can run longer than predicted.
PASS_TARGET_FRACTION = 0.8


def pass_target_s(service) -> float:
    """Longest predicted run the batch former lets a non-realtime pass have."""
    return preemption_budget_s(service) * PASS_TARGET_FRACTION


def preemption_budget_s(service) -> float:
    """Longest predicted run of a non-realtime batch: the service's setting, else half of its
    total_timeout (a realtime job then has the other half for its own batch)."""
    if service.preemption_budget_s:
        return float(service.preemption_budget_s)
    return service.total_timeout / 2
