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
        from inference.dispatch.scaling import ScalingCollector
        from inference.intake import audit, bulk, lookups  # noqa: F401
        from inference.jobs import signals
        from inference.metrics import collector, fairness, receivers
        from renq_site import health
        from routing.config import live_backend_warnings

        receivers.connect()
        fairness.use_plan_weights(plan_weight)
        collector.add_state_collector(ScalingCollector())
        signals.jobs_finished.connect(waiting.on_jobs_finished, dispatch_uid="renq-wake-waiters")
        # A bulk job is finished by whoever stores its last piece.
        signals.outcomes_stored.connect(bulk.on_outcomes_stored, dispatch_uid="renq-finish-bulks")
        # /readyz names the backends that can never be chosen (a key variable unset).
        health.add_warning_source(live_backend_warnings)
