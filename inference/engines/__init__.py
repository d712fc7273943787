"""Inference engines by service kind, loaded once per worker process.

`load_engine(kind, model_ref)` is what workers call: the first call loads the model where
config.yaml's `models:` entry for it says (device, dtype), later calls reuse it, so a Celery
worker process loads each model once. A device or dtype given to the call wins over the file
(the worker passes RENQ_DEVICE); a model's device/dtype change applies when its worker restarts.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from inference.engines.base import AUTO
from inference.jobs.kinds import KINDS

if TYPE_CHECKING:
    from inference.engines.base import Engine

# Engines are imported when a model of their kind is first loaded, not with this package: a
# worker that runs no model (I/O, control, a no-op service) never imports torch.

# By (kind, model_ref, device, dtype) as loaded: one engine per placement.
_loaded_engines: dict[tuple[str, str, str, str], Engine] = {}
# By the call's own arguments: later calls need not read the configuration again.
_engines_by_call: dict[tuple[str, str, str | None, str | None], Engine] = {}
# Threaded worker pools may ask for the same model at once; load it only once.
_loading_lock = threading.Lock()


def configured_placement(kind: str, model_ref: str) -> tuple[str, str]:
    """(device, dtype) of the model in config.yaml `models:`; ("auto", "auto") if unnamed."""
    # Imported here: the engines load without Django until a worker asks for the file's say.
    from inference.config.models import ModelSpec

    return ModelSpec.placement_of(kind, model_ref)


def load_engine(
    kind: str, model_ref: str, *, device: str | None = None, dtype: str | None = None
) -> Engine:
    """The process-wide engine for (kind, model_ref), loading it on first use: on `device` and
    in `dtype` when given, else as the model's config entry says, else auto."""
    try:
        kind_spec = KINDS[kind]
    except KeyError:
        known = ", ".join(sorted(KINDS))
        raise ValueError(f"Unknown engine kind {kind!r}; expected one of: {known}.") from None
    call = (kind, model_ref, device, dtype)
    with _loading_lock:
        engine = _engines_by_call.get(call)
        if engine is not None:
            return engine
        if device is None or dtype is None:
            configured_device, configured_dtype = configured_placement(kind, model_ref)
            device = device or configured_device
            dtype = dtype or configured_dtype
        engine_class = kind_spec.engine_class()
        # Resolve the device first so "auto" and the device it stands for share one engine.
        key = (kind, model_ref, engine_class.placed_on(device), dtype or AUTO)
        engine = _loaded_engines.get(key)
        if engine is None:
            engine = engine_class(model_ref, device=key[2], dtype=key[3])
            _loaded_engines[key] = engine
        _engines_by_call[call] = engine
    return engine


def clear_engine_cache() -> None:
    """Forget loaded engines (tests; or to free memory before loading other models); an
    engine with a thread of its own (the LLM's continuous-batching loop) ends it."""
    with _loading_lock:
        engines = list(_loaded_engines.values())
        _loaded_engines.clear()
        _engines_by_call.clear()
    for engine in engines:
        close = getattr(engine, "close", None)
        if close is not None:
            close()


__all__ = ["clear_engine_cache", "configured_placement", "load_engine"]
