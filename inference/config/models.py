"""The `models:` layer of config.yaml, the scheduler's tier policies, and the change marker."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

from inference.jobs.tiers import AGING_INTERVAL_S, TIER_ORDER
from inference.models import Service, ServiceKind


class Device(models.TextChoices):
    AUTO = "auto", "auto (cuda when available, else cpu; RENQ_DEVICE overrides)"
    CPU = "cpu", "cpu"
    CUDA = "cuda", "cuda"
    MPS = "mps", "mps"


class Dtype(models.TextChoices):
    AUTO = "auto", "auto (the checkpoint's)"
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


class ServiceModelLink(models.Model):
    """Which model a service runs: config.yaml's `services.<name>.model` reference."""

    service = models.OneToOneField(
        Service, on_delete=models.CASCADE, primary_key=True, related_name="model_spec_link"
    )
    model = models.ForeignKey(ModelSpec, on_delete=models.PROTECT, related_name="service_links")

    def __str__(self) -> str:
        return f"{self.service_id} → {self.model}"


# Defaults of the tier policies; config.yaml's `tiers:` overrides them.
# P1:P2:P3 share when all have work (issue #8's default); realtime is strict, its weight unused.
DEFAULT_TIER_WEIGHTS = {"realtime": 0.0, "api": 5.0, "batch": 3.0, "offline": 2.0}
# Longest local wait batch/offline work accepts (spill-over to the cloud, the autoscaler's
# target). Realtime/api targets come from each service's queue_timeout/total_timeout.
DEFAULT_TARGET_WAIT_S: dict[str, float | None] = {
    "realtime": None,
    "api": None,
    "batch": 15 * 60.0,
    "offline": 6 * 3600.0,
}


def default_tier_policies() -> dict[str, dict]:
    return {
        tier.value: {
            "aging_after_s": AGING_INTERVAL_S[tier],
            "weight": DEFAULT_TIER_WEIGHTS[tier.value],
            "target_wait_s": DEFAULT_TARGET_WAIT_S[tier.value],
        }
        for tier in TIER_ORDER
    }


class SchedulerSettings(models.Model):
    """One row (pk 1): scheduler-wide settings from config.yaml `tiers:`. Read them through
    `inference.config.tiers`, which fills in defaults."""

    SINGLETON_PK = 1

    tiers = models.JSONField(
        default=default_tier_policies,
        help_text='Per tier: {"aging_after_s": s, "weight": w, "target_wait_s": s or null}.',
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
