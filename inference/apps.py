from django.apps import AppConfig


class InferenceConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "inference"
    verbose_name = "Inference jobs"

    def ready(self) -> None:
        # The state machine sends signals and does nothing else: the metrics and the front
        # doors' wake-up listen here. The audit trail and the per-process caches connect their
        # own receivers when imported.
        from inference.config.plans import plan_weight
        from inference.delivery import waiting
        from inference.intake import audit, lookups  # noqa: F401
        from inference.jobs import signals
        from inference.metrics import fairness, receivers

        receivers.connect()
        fairness.use_plan_weights(plan_weight)
        signals.jobs_finished.connect(waiting.on_jobs_finished, dispatch_uid="renq-wake-waiters")
