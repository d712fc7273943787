"""Backend adapters by kind. The `local` kind has no adapter: it is the GPU worker queues."""

from __future__ import annotations

from routing.backends.base import AdapterResult, BackendAdapter, BackendError
from routing.backends.openai import OpenAIAdapter

ADAPTERS: dict[str, type[BackendAdapter]] = {"openai": OpenAIAdapter}


def adapter_for(backend) -> BackendAdapter:
    try:
        return ADAPTERS[backend.kind](backend)
    except KeyError:
        raise ValueError(f"backend kind {backend.kind!r} has no HTTP adapter") from None


__all__ = ["ADAPTERS", "AdapterResult", "BackendAdapter", "BackendError", "adapter_for"]
