"""Loading backends and routes: fixtures/config.yaml through `renq_config load --only
backends,routes`, and routing.config."""

from __future__ import annotations

from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from routing.config import ConfigError, load_routing_config
from routing.models import Backend, Route, RouteEntry
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db
FIXTURE = ROOT / "fixtures" / "config.yaml"


def load_routing_sections(path: Path, **kwargs) -> None:
    call_command("renq_config", "load", str(path), "--only", "backends,routes", **kwargs)


@pytest.fixture
def services(make_service):
    return [make_service(kind) for kind in ("embedding", "reranker", "llm")]


def test_fixture_loads_local_free_and_paid_cascades(services, monkeypatch):
    monkeypatch.setenv("RENQ_FAKE_UPSTREAM_URL", "http://127.0.0.1:9999")
    out = StringIO()
    load_routing_sections(FIXTURE, stdout=out)
    assert "loaded 5 backends, 3 routes, 9 entries" in out.getvalue()

    free = Backend.objects.get(name="free-cloud")
    assert free.base_url == "http://127.0.0.1:9999/free/v1"
    assert free.api_key_env == "RENQ_FREE_CLOUD_API_KEY" and free.is_free
    assert not Backend.objects.get(name="paid-cloud").is_free
    cascade = [
        e.backend.name
        for e in RouteEntry.objects.filter(route__service__name="embedding").order_by("order")
    ]
    assert cascade == ["local-embedding", "free-cloud", "paid-cloud"]

    load_routing_sections(FIXTURE, stdout=StringIO())  # idempotent
    assert (Backend.objects.count(), Route.objects.count(), RouteEntry.objects.count()) == (5, 3, 9)


def test_default_upstream_url_without_the_variable(services, monkeypatch):
    monkeypatch.delenv("RENQ_FAKE_UPSTREAM_URL", raising=False)
    load_routing_sections(FIXTURE, stdout=StringIO())
    assert Backend.objects.get(name="paid-cloud").base_url == "http://127.0.0.1:8099/paid/v1"


def test_api_keys_in_clear_are_refused(services):
    config = {"backends": [{"name": "leaky", "kind": "openai", "api_key": "sk-123"}]}
    with pytest.raises(ConfigError, match="api_key_env"):
        load_routing_config(config)
    assert not Backend.objects.exists()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"backends": [{"name": "x", "kind": "openai", "colour": "red"}]}, "unknown field"),
        ({"backends": [{"name": "x", "kind": "local", "service_kinds": ["video"]}]}, "video"),
        ({"routes": [{"service": "nope", "entries": []}]}, "unknown service 'nope'"),
        ({"routes": [{"service": "embedding", "entries": [{"backend": "ghost"}]}]}, "ghost"),
    ],
)
def test_bad_config_names_the_problem(services, config, message):
    with pytest.raises(ConfigError, match=message):
        load_routing_config(config)


def test_command_reports_a_missing_file(services):
    with pytest.raises(CommandError):
        load_routing_sections(Path("/nonexistent/routing.yaml"))
