"""The no-op model: no weights, no torch work. For benchmarks and tests only (no shipped
service uses it), so the stack's own cost per job can be measured without a model.

payload {"texts": [...], "sleep_ms": 0} → {"count": n}. `sleep_ms` per job makes a batch take
the sum of its jobs' sleeps (a stand-in for a slow model, e.g. to test preemption); a text
equal to POISON_TEXT makes the batch raise (a stand-in for an input that breaks a model).
"""

from __future__ import annotations

import time

from inference.engines.base import AUTO, Engine, pick_device

POISON_TEXT = "__renq_poison__"


class NoopEngine(Engine):
    kind = "noop"
    uses_torch = False
    # Nothing is padded: the cost model's padding allowance is 0.
    max_padding_ratio = 0.0

    def __init__(self, model_ref: str, *, device: str | None = None, dtype: str | None = None):
        # Nothing to load: no model folder, and the CPU is always there; dtype is moot.
        self.model_ref = model_ref
        self.device = device or "cpu"
        self.dtype = "float32"  # nothing runs: no torch dtype

    @classmethod
    def placed_on(cls, requested: str | None) -> str:
        # Only a named device is checked (that needs torch): auto is the CPU, always there.
        return "cpu" if not requested or requested == AUTO else pick_device(requested)

    def count_tokens(self, payload: dict) -> int:
        # A slept millisecond counts as a token, so the cost model learns sleeps exactly.
        if payload.get("sleep_ms"):
            return max(1, int(payload["sleep_ms"]))
        return max(1, sum(len(t) for t in payload["texts"]) // 4)

    def run_batch(self, payloads: list[dict]) -> list[dict]:
        if any(POISON_TEXT in p["texts"] for p in payloads):
            raise ValueError("the no-op model was given its poison text")
        sleep_ms = sum(float(p.get("sleep_ms", 0)) for p in payloads)
        if sleep_ms:
            time.sleep(sleep_ms / 1000)
        return [{"count": len(p["texts"])} for p in payloads]
