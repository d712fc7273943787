"""Fixtures of the worker tests."""

from __future__ import annotations

import pytest

from inference.engines import clear_engine_cache
from inference.engines.llm import CONTINUOUS_BATCHING_ENV


@pytest.fixture
def generate_only(monkeypatch):
    """LLM engines loaded in this process serve by generate(), the fallback for models the
    paged cache does not support (chunked passes, RESUME), not by continuous batching."""
    monkeypatch.setenv(CONTINUOUS_BATCHING_ENV, "0")
    clear_engine_cache()
    yield
    clear_engine_cache()
