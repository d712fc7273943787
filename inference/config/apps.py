from django.apps import AppConfig


class RenqConfigConfig(AppConfig):
    """The operator's configuration beyond services and backends: the `models:` layer of
    config.yaml, the tier policies and the change marker workers poll. Its own app (and
    migrations), so it evolves apart from the job models."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "inference.config"
    label = "renq_config"
    verbose_name = "Configuration"

    def ready(self) -> None:
        from inference.config import changes

        changes.connect_signals()
