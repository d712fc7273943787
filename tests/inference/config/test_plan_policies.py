"""Plan policies (config.yaml `plans:`, the admin): tier boost, fair-share weight and realtime cap
per plan, validated with the key path and line, read back with the seed's defaults, and
editable in the admin with the same checks."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from inference.config.file import ConfigFileError, apply_config, dump_config, parse_config
from inference.config.models import PlanPolicy
from inference.config.plans import effective_tier, plan_policies, plan_policy, plan_weight
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db


def problems(text: str) -> list[tuple[str, int | None, str]]:
    with pytest.raises(ConfigFileError) as caught:
        parse_config(textwrap.dedent(text), source="test.yaml")
    return [(p.path, p.line, p.message) for p in caught.value.problems]


def test_defaults_are_the_seeds_table_and_weights():
    policies = plan_policies()
    assert {p: (v.tier_boost, v.weight, v.realtime_cap) for p, v in policies.items()} == {
        "enterprise": (-1, 2.0, None),
        "pro": (0, 1.0, None),
        "free": (1, 0.5, None),
    }
    assert (plan_weight("enterprise"), plan_weight("pro"), plan_weight("free")) == (2.0, 1.0, 0.5)
    assert plan_weight("unknown") == 1.0


def test_the_fixtures_name_every_plan_with_the_defaults():
    for name in ("config.yaml", "config.gpu.yaml"):
        plans = yaml.safe_load((ROOT / "fixtures" / name).read_text())["plans"]
        assert plans == {
            "enterprise": {"tier_boost": -1, "weight": 2.0, "realtime_cap": None},
            "pro": {"tier_boost": 0, "weight": 1.0, "realtime_cap": None},
            "free": {"tier_boost": 1, "weight": 0.5, "realtime_cap": None},
        }


def test_a_loaded_plan_is_read_back_and_dumped_and_others_keep_defaults():
    apply_config(parse_config("plans:\n  free: {tier_boost: 2, realtime_cap: 5}\n"))
    free = plan_policy("free")
    # A key left out takes its default.
    assert (free.tier_boost, free.weight, free.realtime_cap) == (2, 0.5, 5)
    assert effective_tier("realtime", "free") == "batch"
    assert effective_tier("api", "enterprise") == "realtime"
    dumped = dump_config()["plans"]
    assert dumped["free"] == {"tier_boost": 2, "weight": 0.5, "realtime_cap": 5}
    assert dumped["pro"] == {"tier_boost": 0, "weight": 1.0, "realtime_cap": None}
    apply_config(parse_config(yaml.safe_dump({"plans": dumped})))
    assert plan_policies()["free"] == free


def test_a_change_is_seen_by_the_cached_policies():
    assert plan_weight("pro") == 1.0
    apply_config(parse_config("plans:\n  pro: {weight: 3}\n"))
    assert plan_weight("pro") == 3.0
    PlanPolicy.objects.get(plan="pro").delete()
    assert plan_weight("pro") == 1.0


@pytest.mark.parametrize(
    ("text", "path", "message"),
    [
        ("plans:\n  gold: {tier_boost: 0}\n", "plans.gold", "unknown key"),
        ("plans:\n  pro: {boost: 1}\n", "plans.pro.boost", "unknown key"),
        ("plans:\n  pro: {tier_boost: 1.5}\n", "plans.pro.tier_boost", "expected an integer"),
        ("plans:\n  pro: {tier_boost: 4}\n", "plans.pro.tier_boost", "less than or equal to 3"),
        ("plans:\n  pro: {tier_boost: -4}\n", "plans.pro.tier_boost", "greater than or equal"),
        ("plans:\n  pro: {weight: 0}\n", "plans.pro.weight", "must be > 0"),
        ("plans:\n  pro: {weight: fast}\n", "plans.pro.weight", "expected a number"),
        ("plans:\n  pro: {realtime_cap: 0}\n", "plans.pro.realtime_cap", "greater than or equal"),
        ("plans:\n  pro: {realtime_cap: 2.5}\n", "plans.pro.realtime_cap", "expected an integer"),
        ("plans:\n  pro: 3\n", "plans.pro", "expected a mapping"),
    ],
)
def test_a_mistake_names_its_key_path_and_line(text, path, message):
    found = problems(text)
    assert [(p, line) for p, line, _ in found] == [(path, 2)], found
    assert message in found[0][2]


def test_nothing_is_applied_when_a_plan_is_wrong():
    with pytest.raises(ConfigFileError):
        apply_config(parse_config("plans:\n  pro: {weight: 2}\n  free: {weight: -1}\n"))
    assert not PlanPolicy.objects.exists()


def test_the_admin_edits_plans_with_the_same_checks(admin_client):
    add = "/admin/renq_config/planpolicy/add/"
    page = admin_client.get(add)
    assert page.status_code == 200
    # A new row starts from the defaults of the first plan not configured yet.
    assert page.context["adminform"].form.initial["tier_boost"] == -1
    refused = admin_client.post(add, {"plan": "free", "tier_boost": "5", "weight": "0",
                                      "realtime_cap": "0"})  # fmt: skip
    assert refused.status_code == 200
    errors = refused.context["adminform"].form.errors
    assert set(errors) == {"tier_boost", "weight", "realtime_cap"}
    assert "must be > 0" in errors["weight"][0]
    assert not PlanPolicy.objects.exists()
    saved = admin_client.post(add, {"plan": "free", "tier_boost": "1", "weight": "0.25",
                                    "realtime_cap": "10"})  # fmt: skip
    assert saved.status_code == 302
    assert (plan_weight("free"), plan_policy("free").realtime_cap) == (0.25, 10)
    listing = admin_client.get("/admin/renq_config/planpolicy/")
    assert listing.status_code == 200 and "0.25" in listing.content.decode()


def test_a_tenants_admin_page_shows_what_its_plan_entitles_it_to(admin_client, make_tenant):
    tenant, _ = make_tenant(name="capped", plan="free")
    PlanPolicy.objects.create(plan="free", tier_boost=1, weight=0.5, realtime_cap=4)
    listing = admin_client.get("/admin/inference/tenant/").content.decode()
    assert "tier +1, weight 0.5, realtime cap 4 jobs/s" in listing
    page = admin_client.get(f"/admin/inference/tenant/{tenant.pk}/change/").content.decode()
    assert "tier +1, weight 0.5, realtime cap 4 jobs/s" in page
    # The plan is edited on the tenant's page.
    assert 'name="plan"' in page
