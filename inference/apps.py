from django.apps import AppConfig


class InferenceConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "inference"
    verbose_name = "Inference jobs"

    def ready(self) -> None:
        # Connects the receivers: the audit trail's admin changes, and the per-process caches
        # dropped when the configuration change marker moves.
        from inference.intake import (
            audit,  # noqa: F401
            lookups,  # noqa: F401
        )
