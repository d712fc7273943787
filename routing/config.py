"""Apply backends and routes, given as plain data, to Postgres: the routing half of
config.yaml, which `inference.config.file` reads, validates and hands over in this list form.

    {"backends": [{"name": "free-cloud", "kind": "openai",
                   "base_url": "${RENQ_FAKE_UPSTREAM_URL:-http://127.0.0.1:8099}/v1",
                   "api_key_env": "FREE_CLOUD_API_KEY",   # the variable's NAME, never a key
                   "service_kinds": ["embedding"], "rpm_limit": 20}],
     "routes": [{"service": "embedding",
                 "entries": [{"backend": "local-embedding", "order": 0},
                             {"backend": "free-cloud", "order": 1, "weight": 100}]}]}

Strings may use ${VAR} and ${VAR:-default}. Loading is idempotent: backends are updated by
name, and each listed route's entries are replaced by the given ones.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from routing.models import Backend, Route, RouteEntry

BACKEND_FIELDS = {
    "kind",
    "base_url",
    "model_name",
    "api_key_env",
    "service_kinds",
    "max_context_tokens",
    "cost_per_1k_input",
    "cost_per_1k_output",
    "rpm_limit",
    "tpm_limit",
    "rate_window_s",
    "timeout_s",
    "connect_timeout_s",
    "failure_threshold",
    "breaker_cooldown_s",
    "enabled",
}
SECRET_FIELDS = {"api_key", "key", "token", "secret"}
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(ValueError):
    pass


def expand_env(value: Any) -> Any:
    if isinstance(value, str):
        return _ENV_REF.sub(lambda m: os.environ.get(m.group(1)) or (m.group(2) or ""), value)
    if isinstance(value, list):
        return [expand_env(v) for v in value]
    if isinstance(value, dict):
        return {k: expand_env(v) for k, v in value.items()}
    return value


def _backend_defaults(spec: dict, where: str) -> dict:
    secrets = SECRET_FIELDS & set(spec)
    if secrets:
        raise ConfigError(
            f"{where}: '{sorted(secrets)[0]}' is not allowed; name the environment variable "
            f"holding the key with api_key_env instead."
        )
    unknown = set(spec) - BACKEND_FIELDS - {"name"}
    if unknown:
        raise ConfigError(f"{where}: unknown field '{sorted(unknown)[0]}'.")
    if "kind" not in spec:
        raise ConfigError(f"{where}: 'kind' is required (local or openai).")
    defaults = {k: v for k, v in spec.items() if k != "name"}
    for price in ("cost_per_1k_input", "cost_per_1k_output"):
        if price in defaults:
            # Through str: YAML's float 0.00002 is 2.0000000000000002e-05 as a Decimal.
            defaults[price] = Decimal(str(defaults[price]))
    return defaults


@transaction.atomic
def load_routing_config(data: dict) -> dict[str, int]:
    """Create/update backends and routes from parsed config. Returns counts."""
    data = expand_env(data or {})
    backends: dict[str, Backend] = {}
    for i, spec in enumerate(data.get("backends") or []):
        where = f"backends[{i}]"
        if not isinstance(spec, dict) or not spec.get("name"):
            raise ConfigError(f"{where}: needs a name.")
        defaults = _backend_defaults(spec, where)
        backend, _ = Backend.objects.update_or_create(name=spec["name"], defaults=defaults)
        try:
            backend.full_clean()
        except ValidationError as exc:
            raise ConfigError(f"{where} ({spec['name']}): {exc.message_dict}") from exc
        backends[backend.name] = backend
    entries = 0
    routes = data.get("routes") or []
    for i, spec in enumerate(routes):
        where = f"routes[{i}]"
        # The service model, reached through the route's foreign key: routing imports
        # nothing from the job lifecycle it serves.
        service_model = Route._meta.get_field("service").related_model
        try:
            service = service_model.objects.get(name=spec["service"])
        except (KeyError, TypeError):
            raise ConfigError(f"{where}: needs a service.") from None
        except service_model.DoesNotExist:
            raise ConfigError(f"{where}: unknown service '{spec['service']}'.") from None
        route, _ = Route.objects.update_or_create(
            service=service, defaults={"enabled": spec.get("enabled", True)}
        )
        route.entries.all().delete()
        for j, entry in enumerate(spec.get("entries") or []):
            name = entry.get("backend")
            backend = backends.get(name) or Backend.objects.filter(name=name).first()
            if backend is None:
                raise ConfigError(f"{where}.entries[{j}]: unknown backend '{name}'.")
            RouteEntry.objects.create(
                route=route,
                backend=backend,
                order=int(entry.get("order", j)),
                weight=int(entry.get("weight", 100)),
            )
            entries += 1
    return {"backends": len(backends), "routes": len(routes), "entries": entries}


def backend_warnings(backends: Iterable[Backend]) -> list[str]:
    """One line per enabled backend that can serve no job as configured in this environment
    (e.g. its API key variable is unset): the router never chooses it, not even as a last
    resort. Worth a warning, not an error: the others still serve."""
    return [
        f"backend {backend.name}: unusable, never chosen: {why}"
        for backend in backends
        if backend.enabled and (why := backend.adapter().misconfiguration())
    ]


def live_backend_warnings() -> list[str]:
    """`backend_warnings` of the live configuration (/readyz)."""
    return backend_warnings(Backend.objects.filter(enabled=True))
