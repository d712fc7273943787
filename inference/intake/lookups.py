"""Per-process caches of what every request reads and seldom changes: API keys (with their
tenant) and services by name. They are dropped whenever the configuration change marker moves
(inference.config.changes: any save of a service, tenant, key, backend or route bumps it), and
the marker is read at most once a second, so a revoked key or a changed quota takes effect in
every web process within about a second, and a request costs no query for either lookup."""

from __future__ import annotations

import os
import threading

from inference.config.changes import ConfigWatcher, config_changed
from inference.dispatch.queues import served_service_names
from inference.models import ApiKey, Service
from routing.router import forget_routes

# How often (s) a web process looks at the change marker: the staleness bound of the caches.
# The test suite sets 0 (every request looks): it recreates rows between tests within a second.
RECHECK_INTERVAL_S = float(os.environ.get("RENQ_CONFIG_RECHECK_S", "1.0"))

_lock = threading.Lock()
_watcher = ConfigWatcher(min_interval_s=RECHECK_INTERVAL_S)
_keys: dict[str, ApiKey | None] = {}
_services: dict[str, Service | None] = {}


def _fresh() -> None:
    with _lock:
        if _watcher.changed():
            _keys.clear()
            _services.clear()
            forget_routes()


def bearer_key(authorization: str) -> str | None:
    """The key of `Authorization: Bearer <key>`, or None when the header names none."""
    scheme, _, key = authorization.partition(" ")
    return key.strip() if scheme.lower() == "bearer" and key.strip() else None


def api_key(plaintext: str) -> ApiKey | None:
    """The active, unrevoked key with its tenant loaded, or None. Unknown keys are not cached
    (a guess must not fill memory); their cost is bounded by the brute-force limit."""
    _fresh()
    digest = ApiKey.hash(plaintext)
    if digest in _keys:
        return _keys[digest]
    key = ApiKey.objects.authenticate(plaintext)
    if key is not None:
        _keys[digest] = key
    return key


def active_service(name: str) -> Service | None:
    _fresh()
    if name not in _services:
        _services[name] = Service.objects.filter(name=name, active=True).first()
    return _services[name]


def active_service_of_queue(queue: str | None) -> Service | None:
    """The active service whose tier queue this is, if any."""
    names = served_service_names({queue}) if queue else set()
    return active_service(names.pop()) if len(names) == 1 else None


def cached_api_key(plaintext: str) -> ApiKey | None:
    """The key as this process last found it valid, or None when it has not (never queries,
    never looks at the change marker: up to a recheck staler than api_key). For work that the
    full lookup confirms before anything of it counts."""
    return _keys.get(ApiKey.hash(plaintext))


def cached_service(name: str) -> Service | None:
    """The active service as this process has it cached, or None (never queries; as stale as
    cached_api_key)."""
    return _services.get(name)


def forget_all() -> None:
    """Drop every cached row now (tests that change rows without saving them)."""
    with _lock:
        _keys.clear()
        _services.clear()
        forget_routes()


def _changed_here(**_kwargs) -> None:
    forget_all()


config_changed.connect(_changed_here, dispatch_uid="renq-lookups-forget")
