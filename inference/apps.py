from django.apps import AppConfig


class InferenceConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "inference"
    verbose_name = "Inference jobs"

    def ready(self) -> None:
        # Connects the admin-change receiver of the audit trail.
        from inference import audit  # noqa: F401
