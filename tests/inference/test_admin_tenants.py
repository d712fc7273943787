"""A tenant's plan and quotas in the admin: refused when invalid (naming the field), and a
change moves the change marker, so every web process's cached tenant follows within a second."""

from __future__ import annotations

import pytest

from inference.config.models import ConfigChange
from inference.models import Tenant

pytestmark = pytest.mark.django_db


def marker_version() -> int:
    row = ConfigChange.objects.filter(pk=ConfigChange.SINGLETON_PK).first()
    return row.version if row else 0


def tenant_form(tenant: Tenant, **overrides) -> dict[str, str]:
    data = {
        "name": tenant.name,
        "plan": tenant.plan,
        "default_tier": tenant.default_tier,
        "active": "on",
        "requests_per_minute": "0",
        "max_running_jobs": "0",
        "monthly_token_budget": "0",
        # The API keys inline, empty.
        "api_keys-TOTAL_FORMS": "0",
        "api_keys-INITIAL_FORMS": "0",
        "api_keys-MIN_NUM_FORMS": "0",
        "api_keys-MAX_NUM_FORMS": "1000",
    }
    data.update(overrides)
    return data


@pytest.mark.parametrize(
    ("field", "value"), [("plan", "platinum"), ("max_running_jobs", "-1"), ("default_tier", "P9")]
)
def test_an_invalid_plan_or_quota_is_refused_on_its_field(admin_client, field, value):
    tenant = Tenant.objects.create(name="acme", plan="free")
    before = marker_version()
    url = f"/admin/inference/tenant/{tenant.pk}/change/"
    response = admin_client.post(url, tenant_form(tenant, **{field: value}))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field], errors
    assert marker_version() == before
    tenant.refresh_from_db()
    assert tenant.plan == "free"


def test_a_plan_change_is_saved_and_moves_the_change_marker(admin_client):
    tenant = Tenant.objects.create(name="acme", plan="free")
    before = marker_version()
    url = f"/admin/inference/tenant/{tenant.pk}/change/"
    response = admin_client.post(url, tenant_form(tenant, plan="enterprise"))
    assert response.status_code == 302, response.context["adminform"].form.errors
    tenant.refresh_from_db()
    assert tenant.plan == "enterprise"
    assert marker_version() > before
