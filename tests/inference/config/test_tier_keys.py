"""Each tier takes only the `tiers:` keys that do something for it: nothing is promoted into
realtime, so realtime and api have no aging_after_s, and realtime (served strictly, outside the
weighted share) has no weight."""

from __future__ import annotations

import textwrap

import pytest
import yaml

from inference.config.file import ConfigFileError, apply_config, dump_config, parse_config
from inference.config.models import SchedulerSettings
from inference.config.tiers import tier_policies, tier_policy
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db


def problems(text: str) -> list[tuple[str, int | None, str]]:
    with pytest.raises(ConfigFileError) as caught:
        parse_config(textwrap.dedent(text), source="test.yaml")
    return [(p.path, p.line, p.message) for p in caught.value.problems]


@pytest.mark.parametrize(
    ("text", "path", "reason"),
    [
        ("tiers:\n  api: {aging_after_s: 10}\n", "tiers.api.aging_after_s", "never promoted"),
        (
            "tiers:\n  realtime: {aging_after_s: 0}\n",
            "tiers.realtime.aging_after_s",
            "nothing to promote it to",
        ),
        ("tiers:\n  realtime: {weight: 0}\n", "tiers.realtime.weight", "outside the weighted"),
        ("tiers:\n  api: {colour: red}\n", "tiers.api.colour", "unknown key"),
    ],
)
def test_a_key_the_tier_does_not_take_is_refused_with_the_reason(text, path, reason):
    found = problems(text)
    assert [(p, line) for p, line, _ in found] == [(path, 2)], found
    assert reason in found[0][2]


def test_the_fixtures_give_each_tier_only_its_keys():
    for name in ("config.yaml", "config.gpu.yaml"):
        tiers = yaml.safe_load((ROOT / "fixtures" / name).read_text())["tiers"]
        assert set(tiers["realtime"]) == {"target_wait_s"}
        assert set(tiers["api"]) == {"weight", "target_wait_s"}
        assert (
            set(tiers["batch"])
            == set(tiers["offline"])
            == {
                "aging_after_s",
                "weight",
                "target_wait_s",
            }
        )


def test_keys_left_by_an_older_load_are_ignored_and_dropped():
    SchedulerSettings.objects.update_or_create(
        pk=SchedulerSettings.SINGLETON_PK,
        defaults={"tiers": {"api": {"aging_after_s": 10.0, "weight": 4.0}}},
    )
    assert tier_policy("api").aging_after_s == 0.0  # never promoted
    assert tier_policy("api").weight == 4.0
    assert "aging_after_s" not in dump_config()["tiers"]["api"]
    apply_config(parse_config("tiers:\n  batch: {weight: 2}\n"))
    stored = SchedulerSettings.load().tiers
    assert stored["api"] == {"weight": 4.0, "target_wait_s": None}
    assert set(stored["realtime"]) == {"target_wait_s"}
    assert tier_policies()["batch"].weight == 2.0
