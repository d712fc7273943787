"""Backend adapters by kind: one class per kind behind `BackendAdapter`."""

from __future__ import annotations

from routing.backends.base import (
    AdapterResult,
    BackendAdapter,
    BackendError,
    Placement,
)
from routing.backends.local import LocalAdapter
from routing.backends.openai import OpenAIAdapter

ADAPTERS: dict[str, type[BackendAdapter]] = {"local": LocalAdapter, "openai": OpenAIAdapter}


def adapter_for(backend) -> BackendAdapter:
    try:
        return ADAPTERS[backend.kind](backend)
    except KeyError:
        raise ValueError(f"backend kind {backend.kind!r} has no adapter") from None


def known_service_kinds() -> set[str]:
    return {kind for adapter in ADAPTERS.values() for kind in adapter.service_kinds}


__all__ = [
    "ADAPTERS",
    "AdapterResult",
    "BackendAdapter",
    "BackendError",
    "Placement",
    "adapter_for",
    "known_service_kinds",
]
