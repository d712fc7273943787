"""The vector size of each embedding model, as the workers that warmed it noted it: a front
door refuses a `dimensions` larger than the model's before the job runs, not after.

Noted by model (its `model_ref`), in Redis, by every worker as it warms the model; read by the
web, which keeps what it read for a minute. Disposable: a size not noted yet (no worker warmed
the model since Redis was emptied) only moves the refusal to after the run.
"""

from __future__ import annotations

import logging
import time

import redis

from renq_site.shared_redis import shared_redis

logger = logging.getLogger(__name__)

DIMS_KEY = "renq:embedding-dims"
# How long a process trusts a size it read: a model replaced under the same model_ref is
# noted again by the worker that loads it.
KEEP_S = 60.0
_read: dict[str, tuple[int, float]] = {}  # model_ref → (dim, when read, monotonic)


def note_embedding_dim(model_ref: str, dim: int) -> None:
    """A worker warmed `model_ref` and it answered vectors of `dim` values. Best effort."""
    try:
        shared_redis().hset(DIMS_KEY, model_ref, dim)
    except redis.RedisError:
        logger.warning("could not note the vector size of %s", model_ref, exc_info=True)


def embedding_dim(model_ref: str) -> int | None:
    """The vector size a worker noted for `model_ref`, or None (none noted, or Redis away)."""
    kept = _read.get(model_ref)
    if kept is not None and time.monotonic() - kept[1] < KEEP_S:
        return kept[0]
    try:
        value = shared_redis().hget(DIMS_KEY, model_ref)
    except redis.RedisError:
        return None
    if value is None:
        return None
    _read[model_ref] = (int(value), time.monotonic())
    return int(value)


def forget_embedding_dims() -> None:
    """Drop what this process read (tests)."""
    _read.clear()
