"""The texts the bench sends: short ones (one per job, as the issue's e2e figure has them),
long ones and a mix of lengths. Nothing else: importable where Django is not installed (a GPU
machine running bench/inprocess_pipeline.py)."""

from __future__ import annotations

import random

WORDS = (
    "model queue batch token latency priority worker tenant cloud local route cost cache "
    "embedding reranker vector request result budget window tier offline realtime api gpu "
    "scheduler throughput padding bucket cascade fallback limit health moving average"
).split()


def short_texts(n: int, seed: int = 7) -> list[str]:
    """6 to 14 words each, numbered so no two are the same."""
    rng = random.Random(seed)
    return [f"{i} " + " ".join(rng.choices(WORDS, k=rng.randint(6, 14))) for i in range(n)]


def long_text(rng: random.Random, words: int = 160) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(words - 10, words + 10)))


def mixed_texts(n: int, seed: int = 11) -> list[str]:
    rng = random.Random(seed)
    # Log-uniform lengths from a few words to ~200: the shape of real traffic.
    return [" ".join(rng.choices(WORDS, k=int(2 ** rng.uniform(1.5, 7.6)))) for _ in range(n)]
