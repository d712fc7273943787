from django.apps import AppConfig


class BatchApiConfig(AppConfig):
    """The Batch API's files, batches and their lines. Its tables keep the names they had in
    the inference app (`db_table`), so moving the models here copied no data."""

    default_auto_field = "django.db.models.BigAutoField"
    name = "inference.batch_api"
    label = "batch_api"
    verbose_name = "Batch API"
