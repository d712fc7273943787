"""The configuration in the admin: the tier policies (config.yaml `tiers:`) as a form with one
field per tier and key, refused by the same checks as the file."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.http import HttpResponseRedirect
from django.urls import reverse

from inference.config.file import TIER_KEY_REFUSALS, tier_policy_problems
from inference.config.models import (
    TIER_POLICY_KEYS,
    PlanPolicy,
    SchedulerSettings,
    default_plan_policies,
    default_tier_policies,
)
from inference.jobs.tiers import TIER_ORDER, Plan

TIER_KEY_LABELS = {
    "aging_after_s": "promote after (s)",
    "weight": "weight",
    "target_wait_s": "target wait (s)",
}
TIER_KEY_HELP = {
    "aging_after_s": "A job waiting this long moves one tier up (0 = never).",
    "weight": "Share when tiers below realtime all have work (0 = only when they have none).",
    "target_wait_s": "Longest local wait before spill-over and scale-up; empty = the "
    "service's queue_timeout/total_timeout.",
}


def tier_field_name(tier: str, key: str) -> str:
    return f"{tier}__{key}"


# tiers.<tier>.<key> (a problem's path) → the form field that holds it.
_FIELD_OF_PATH = {
    f"tiers.{tier.value}.{key}": tier_field_name(tier.value, key)
    for tier in TIER_ORDER
    for key in TIER_POLICY_KEYS[tier.value]
}


def _tier_fields() -> dict[str, forms.Field]:
    fields: dict[str, forms.Field] = {}
    for tier in TIER_ORDER:
        for key in TIER_POLICY_KEYS[tier.value]:
            fields[tier_field_name(tier.value, key)] = forms.FloatField(
                label=f"{tier.label}: {TIER_KEY_LABELS[key]}",
                help_text=TIER_KEY_HELP[key],
                # Range checks are the file's (clean()), so both refuse the same values.
                required=key != "target_wait_s",
            )
    return fields


class SchedulerSettingsForm(forms.ModelForm):
    """The `tiers` JSON as typed fields; saving stores the full policy of every tier."""

    class Meta:
        model = SchedulerSettings
        fields: tuple[str, ...] = ()

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        stored = (self.instance.tiers if self.instance else None) or {}
        for tier, policy in default_tier_policies().items():
            allowed = TIER_POLICY_KEYS[tier]
            policy.update({k: v for k, v in stored.get(tier, {}).items() if k in allowed})
            for key, value in policy.items():
                self.initial.setdefault(tier_field_name(tier, key), value)

    def tier_section(self) -> dict[str, dict]:
        """The tiers as config.yaml's `tiers:` would write them, from the fields that parsed."""
        section: dict[str, dict] = {}
        for tier in TIER_ORDER:
            policy = section.setdefault(tier.value, {})
            for key in TIER_POLICY_KEYS[tier.value]:
                name = tier_field_name(tier.value, key)
                if name in self.cleaned_data:
                    value = self.cleaned_data[name]
                    # Whole numbers stay integers, as an operator writes them in the file.
                    if isinstance(value, float) and value.is_integer():
                        value = int(value)
                    policy[key] = value
        return section

    def clean(self) -> dict:
        cleaned = super().clean()
        for problem in tier_policy_problems(self.tier_section()):
            field = _FIELD_OF_PATH.get(problem.path)
            if field is not None and field in self.errors:
                continue
            self.add_error(field, problem.message)
        return cleaned

    def save(self, commit: bool = True) -> SchedulerSettings:
        self.instance.tiers = self.tier_section()
        # The save's post_save signal bumps the change marker: running workers reload.
        return super().save(commit=commit)


# Declared after the class: the fields are built from the tier table. ModelAdmin's form
# factory keeps declared fields that are not model fields, so the fieldsets may name them.
_TIER_FIELDS = _tier_fields()
SchedulerSettingsForm.base_fields.update(_TIER_FIELDS)
SchedulerSettingsForm.declared_fields.update(_TIER_FIELDS)


def _tier_description(tier: str) -> str:
    refused = [why for (t, _key), why in TIER_KEY_REFUSALS.items() if t == tier]
    return "; ".join(refused)


@admin.register(SchedulerSettings)
class SchedulerSettingsAdmin(admin.ModelAdmin):
    """One row: the list page opens it, nobody adds or deletes it."""

    form = SchedulerSettingsForm
    readonly_fields = ("updated_at",)
    fieldsets = [
        (
            tier.label,
            {
                "fields": [tier_field_name(tier.value, k) for k in TIER_POLICY_KEYS[tier.value]],
                "description": _tier_description(tier.value),
            },
        )
        for tier in TIER_ORDER
    ] + [(None, {"fields": ["updated_at"]})]

    def has_add_permission(self, request) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def get_object(self, request, object_id, from_field=None):
        if str(object_id) != str(SchedulerSettings.SINGLETON_PK):
            return None
        # Before the first save the page shows the defaults; saving creates the row.
        found = SchedulerSettings.objects.filter(pk=SchedulerSettings.SINGLETON_PK).first()
        return found or SchedulerSettings(pk=SchedulerSettings.SINGLETON_PK)

    def changelist_view(self, request, extra_context=None):
        return HttpResponseRedirect(
            reverse(
                "admin:renq_config_schedulersettings_change",
                args=[SchedulerSettings.SINGLETON_PK],
            )
        )


@admin.register(PlanPolicy)
class PlanPolicyAdmin(admin.ModelAdmin):
    """What each plan entitles its tenants to (config.yaml `plans:`); a plan without a row
    takes the defaults. The ranges are the model's validators, which the file checks too."""

    list_display = ("plan", "tier_boost", "weight", "realtime_cap")
    list_editable = ("tier_boost", "weight", "realtime_cap")

    def get_changeform_initial_data(self, request) -> dict:
        # A new row starts from the defaults of the first plan not configured yet.
        initial = super().get_changeform_initial_data(request)
        configured = set(PlanPolicy.objects.values_list("plan", flat=True))
        plan = initial.get("plan") or next((p for p in Plan.values if p not in configured), None)
        if plan in Plan.values:
            initial = {**default_plan_policies()[plan], **initial, "plan": plan}
        return initial
