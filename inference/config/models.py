"""The `models:` layer of config.yaml, the scheduler's tier and plan policies, and the change
marker."""

from __future__ import annotations

import logging
from typing import NamedTuple

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator, MinValueValidator, RegexValidator
from django.db import models

from inference.jobs.tiers import AGING_INTERVAL_S, DEFAULT_TIER_BOOST, TIER_ORDER, Plan
from inference.models import Service, ServiceKind

logger = logging.getLogger(__name__)


class Device(models.TextChoices):
    AUTO = "auto", "auto (cuda when available, else cpu; RENQ_DEVICE overrides)"
    CPU = "cpu", "cpu"
    CUDA = "cuda", "cuda"
    MPS = "mps", "mps"


class Dtype(models.TextChoices):
    AUTO = "auto", "auto (float16 on CUDA, bfloat16 for LLMs where supported; else float32)"
    FLOAT32 = "float32", "float32"
    FLOAT16 = "float16", "float16"
    BFLOAT16 = "bfloat16", "bfloat16"


DEVICE_VALIDATOR = RegexValidator(
    r"^(auto|cpu|mps|cuda(:\d+)?)$", "expected auto, cpu, mps, cuda or cuda:N"
)


class ModelSpec(models.Model):
    """One model a service can run (config.yaml `models:`): what it is and where it loads from,
    apart from the service's runtime knobs, so two services can share one model."""

    name = models.SlugField(max_length=60, unique=True, help_text="Referenced by services.")
    kind = models.CharField(
        "type", max_length=16, choices=ServiceKind.choices, help_text="The service kind it serves."
    )
    model_ref = models.CharField(
        max_length=300,
        help_text="package:<python package> or a folder path (relative to the project root); "
        "copied to the services that use the model.",
    )
    device = models.CharField(
        max_length=16,
        default=Device.AUTO,
        validators=[DEVICE_VALIDATOR],
        help_text="auto, cpu, mps, cuda or cuda:N. A worker's RENQ_DEVICE wins over this.",
    )
    dtype = models.CharField(max_length=16, choices=Dtype.choices, default=Dtype.AUTO)

    class Meta:
        ordering = ["name"]
        verbose_name = "model"

    def __str__(self) -> str:
        return self.name

    @classmethod
    def placement_of(cls, kind: str, model_ref: str) -> ModelPlacement:
        """The configured device and dtype of the model entry for (kind, model_ref); auto/auto
        when none names it. Entries sharing one model_ref with different placements cannot
        both hold in one worker (it loads a model once): the first by name wins, with a
        warning."""
        found = list(
            cls.objects.filter(kind=kind, model_ref=model_ref)
            .order_by("name")
            .values_list("name", "device", "dtype")
        )
        if not found:
            return ModelPlacement(Device.AUTO, Dtype.AUTO)
        name, device, dtype = found[0]
        others = [other for other, *placement in found[1:] if placement != [device, dtype]]
        if others:
            logger.warning(
                "models %s load %s like %s but on another device/dtype; %s's (%s, %s) is used",
                ", ".join(others),
                model_ref,
                name,
                name,
                device,
                dtype,
            )
        return ModelPlacement(device, dtype)


class ModelPlacement(NamedTuple):
    """Where and in what precision a model loads (config.yaml `models.<name>.device/dtype`)."""

    device: str
    dtype: str


class ServiceModelLink(models.Model):
    """Which model a service runs: config.yaml's `services.<name>.model` reference."""

    service = models.OneToOneField(
        Service, on_delete=models.CASCADE, primary_key=True, related_name="model_spec_link"
    )
    model = models.ForeignKey(ModelSpec, on_delete=models.PROTECT, related_name="service_links")

    def __str__(self) -> str:
        return f"{self.service_id} → {self.model}"


# The keys config.yaml's `tiers:` takes for each tier. Realtime is served strictly, before the
# weighted share, so it has no weight; nothing is promoted into realtime (P0 stays strict for
# jobs submitted as realtime), so neither realtime nor api ages.
TIER_POLICY_KEYS: dict[str, tuple[str, ...]] = {
    "realtime": ("target_wait_s",),
    "api": ("weight", "target_wait_s"),
    "batch": ("aging_after_s", "weight", "target_wait_s"),
    "offline": ("aging_after_s", "weight", "target_wait_s"),
}
# Defaults of the tier policies; config.yaml's `tiers:` overrides them.
# P1:P2:P3 share when all have work.
DEFAULT_TIER_WEIGHTS = {"api": 5.0, "batch": 3.0, "offline": 2.0}
# Longest local wait batch/offline work accepts (spill-over to the cloud, the autoscaler's
# target). Realtime/api targets come from each service's queue_timeout/total_timeout.
DEFAULT_TARGET_WAIT_S: dict[str, float | None] = {
    "realtime": None,
    "api": None,
    "batch": 15 * 60.0,
    "offline": 6 * 3600.0,
}


def default_tier_policies() -> dict[str, dict]:
    """Each tier's configurable keys (TIER_POLICY_KEYS) with their defaults."""
    defaults = {
        "aging_after_s": AGING_INTERVAL_S,
        "weight": DEFAULT_TIER_WEIGHTS,
        "target_wait_s": DEFAULT_TARGET_WAIT_S,
    }
    return {
        tier.value: {key: defaults[key][tier.value] for key in TIER_POLICY_KEYS[tier.value]}
        for tier in TIER_ORDER
    }


class SchedulerSettings(models.Model):
    """One row (pk 1): scheduler-wide settings from config.yaml `tiers:`. Read them through
    `inference.config.tiers`, which fills in defaults."""

    SINGLETON_PK = 1

    tiers = models.JSONField(
        default=default_tier_policies,
        help_text='Per tier: {"aging_after_s": s, "weight": w, "target_wait_s": s or null} '
        "(realtime: target_wait_s only; api: no aging_after_s).",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = verbose_name_plural = "scheduler settings"

    def __str__(self) -> str:
        return "scheduler settings"

    def save(self, *args, **kwargs) -> None:
        self.pk = self.SINGLETON_PK
        super().save(*args, **kwargs)

    @classmethod
    def load(cls) -> SchedulerSettings:
        settings, _ = cls.objects.get_or_create(pk=cls.SINGLETON_PK)
        return settings


# Defaults of the plan policies; config.yaml's `plans:` overrides them. A tenant's share of a
# contended tier is proportional to its plan's weight.
DEFAULT_PLAN_WEIGHTS: dict[str, float] = {Plan.ENTERPRISE: 2.0, Plan.PRO: 1.0, Plan.FREE: 0.5}
PLAN_POLICY_KEYS = ("tier_boost", "weight", "realtime_cap")
# A boost beyond this moves every request to one end (realtime or offline).
MAX_TIER_BOOST = len(TIER_ORDER) - 1


def default_plan_policies() -> dict[str, dict]:
    return {
        plan.value: {
            "tier_boost": DEFAULT_TIER_BOOST[plan],
            "weight": DEFAULT_PLAN_WEIGHTS[plan],
            "realtime_cap": None,
        }
        for plan in Plan
    }


def validate_positive(value: float) -> None:
    if value <= 0:
        raise ValidationError(f"must be > 0, got {value!r}")


class PlanPolicy(models.Model):
    """What a plan entitles its tenants to (config.yaml `plans:`): a plan without a row takes
    the defaults. Read through `inference.config.plans`."""

    plan = models.CharField(max_length=16, choices=Plan.choices, unique=True)
    tier_boost = models.SmallIntegerField(
        validators=[MinValueValidator(-MAX_TIER_BOOST), MaxValueValidator(MAX_TIER_BOOST)],
        help_text="Tiers added to the requested one (-1: api is served as realtime; +1: "
        "realtime as api), clamped to realtime..offline.",
    )
    weight = models.FloatField(
        validators=[validate_positive],
        help_text="Share of a contended tier relative to other plans' tenants (> 0).",
    )
    realtime_cap = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Realtime jobs per second per tenant; beyond it they are served as api. "
        "Empty = no cap.",
    )

    class Meta:
        ordering = ["plan"]
        verbose_name = "plan policy"
        verbose_name_plural = "plan policies"

    def __str__(self) -> str:
        return f"{self.plan} plan"


class ConfigChange(models.Model):
    """One row, bumped whenever services, models, backends, routes or tier policies change
    (signals, and the config loader), as django-celery-beat's PeriodicTasks does: a running
    worker polls this single row to know when to reload, instead of re-reading everything."""

    SINGLETON_PK = 1

    version = models.PositiveBigIntegerField(default=0, help_text="+1 on every change.")
    last_update = models.DateTimeField(help_text="Database time of the latest change.")

    class Meta:
        verbose_name = "configuration change marker"

    def __str__(self) -> str:
        return f"configuration v{self.version} ({self.last_update:%Y-%m-%d %H:%M:%S})"
