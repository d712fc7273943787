"""Inference engines by service kind, loaded once per worker process.

`load_engine(kind, model_ref)` is what workers call: the first call for a (kind, model_ref,
device) loads the model, later calls reuse it, so a Celery worker process loads each model once.
"""

from __future__ import annotations

import threading

from inference.engines.base import Engine, pick_device, resolve_model_path
from inference.engines.embedding import EmbeddingEngine
from inference.engines.llm import LlmEngine
from inference.engines.reranker import RerankerEngine
from inference.jobs.kinds import KINDS

# The kinds registry names each kind's engine; this is the same mapping, resolved.
ENGINE_CLASSES: dict[str, type[Engine]] = {
    name: spec.engine_class() for name, spec in KINDS.items()
}

_loaded_engines: dict[tuple[str, str, str], Engine] = {}
# Threaded worker pools may ask for the same model at once; load it only once.
_loading_lock = threading.Lock()


def load_engine(kind: str, model_ref: str, *, device: str | None = None) -> Engine:
    """The process-wide engine for (kind, model_ref, device), loading it on first use."""
    try:
        engine_class = ENGINE_CLASSES[kind]
    except KeyError:
        known = ", ".join(sorted(ENGINE_CLASSES))
        raise ValueError(f"Unknown engine kind {kind!r}; expected one of: {known}.") from None
    # Resolve the device first so device=None and the device it stands for share one engine.
    key = (kind, model_ref, pick_device(device))
    with _loading_lock:
        engine = _loaded_engines.get(key)
        if engine is None:
            engine = engine_class(model_ref, device=key[2])
            _loaded_engines[key] = engine
    return engine


def clear_engine_cache() -> None:
    """Forget loaded engines (tests; or to free memory before loading other models)."""
    with _loading_lock:
        _loaded_engines.clear()


__all__ = [
    "ENGINE_CLASSES",
    "EmbeddingEngine",
    "Engine",
    "LlmEngine",
    "RerankerEngine",
    "clear_engine_cache",
    "load_engine",
    "pick_device",
    "resolve_model_path",
]
