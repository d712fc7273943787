"""The tier policies in the admin: one field per tier and key, refused by config.yaml's own
checks (naming the field), and a save moves the change marker running workers poll."""

from __future__ import annotations

import pytest

from inference.config.admin import tier_field_name
from inference.config.models import TIER_POLICY_KEYS, ConfigChange, SchedulerSettings
from inference.config.tiers import tier_policies

pytestmark = pytest.mark.django_db

URL = "/admin/renq_config/schedulersettings/1/change/"


def form_data(**overrides) -> dict[str, str]:
    """Every field as the page shows it (the current policies), with `overrides`."""
    data = {}
    for tier, policy in tier_policies().items():
        for key in TIER_POLICY_KEYS[tier]:
            value = getattr(policy, key)
            data[tier_field_name(tier, key)] = "" if value is None else str(value)
    data.update(overrides)
    return data


def marker_version() -> int:
    row = ConfigChange.objects.filter(pk=ConfigChange.SINGLETON_PK).first()
    return row.version if row else 0


def test_the_list_opens_the_one_row_and_the_page_shows_every_tier(admin_client):
    listing = admin_client.get("/admin/renq_config/schedulersettings/")
    assert listing.status_code == 302 and listing["Location"].endswith(URL)
    page = admin_client.get(URL)
    assert page.status_code == 200
    form = page.context["adminform"].form
    assert set(form.fields) == {
        tier_field_name(tier, key) for tier, keys in TIER_POLICY_KEYS.items() for key in keys
    }
    # The tiers that do not take a key say why, and have no field for it.
    assert "batch__aging_after_s" in form.fields and "api__aging_after_s" not in form.fields
    assert "outside the weighted share" in page.content.decode()
    assert form.initial["batch__aging_after_s"] == tier_policies()["batch"].aging_after_s


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("batch__weight", "-1", "expected a number ≥ 0"),
        ("offline__aging_after_s", "-5", "expected a number ≥ 0"),
        ("batch__target_wait_s", "0", "expected a number > 0"),
        ("api__weight", "lots", "Enter a number."),
    ],
)
def test_an_invalid_value_is_refused_on_its_field(admin_client, field, value, message):
    before, policies = marker_version(), tier_policies()
    response = admin_client.post(URL, form_data(**{field: value}))
    assert response.status_code == 200  # the form again, not a redirect
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field], errors
    assert message in errors[field][0]
    assert marker_version() == before
    assert tier_policies() == policies


def test_a_valid_save_stores_the_policies_and_moves_the_change_marker(admin_client):
    before = marker_version()
    response = admin_client.post(
        URL,
        form_data(batch__aging_after_s="45", offline__weight="1.5", api__target_wait_s=""),
    )
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert marker_version() > before
    policies = tier_policies()
    assert policies["batch"].aging_after_s == 45.0
    assert policies["offline"].weight == 1.5
    assert policies["api"].target_wait_s is None
    stored = SchedulerSettings.load().tiers
    # Whole numbers are stored as the file writes them; no key a tier does not take.
    aging = stored["batch"]["aging_after_s"]
    assert aging == 45 and isinstance(aging, int)
    assert set(stored["realtime"]) == {"target_wait_s"}
    assert set(stored["api"]) == {"weight", "target_wait_s"}


def test_nobody_adds_or_deletes_the_row(admin_client):
    SchedulerSettings.load()
    assert admin_client.get("/admin/renq_config/schedulersettings/add/").status_code == 403
    assert admin_client.get("/admin/renq_config/schedulersettings/1/delete/").status_code == 403
