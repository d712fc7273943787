"""The Batch API's models, taken over from the inference app (its 0012 lets them go).

State only: the tables that inference's 0004 created keep their names (`db_table`), rows,
indexes and foreign keys. The content types are relabelled, so admin permissions and log
entries follow the models instead of being recreated.
"""

import uuid

import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models

MOVED_MODELS = ("batchfile", "batch", "batchrequest")


def relabel_content_types(from_label: str, to_label: str):
    def relabel(apps, schema_editor) -> None:
        content_types = apps.get_model("contenttypes", "ContentType").objects.using(
            schema_editor.connection.alias
        )
        # A fresh database has none yet (post_migrate creates them under the new label).
        taken = set(
            content_types.filter(app_label=to_label, model__in=MOVED_MODELS).values_list(
                "model", flat=True
            )
        )
        content_types.filter(
            app_label=from_label, model__in=[m for m in MOVED_MODELS if m not in taken]
        ).update(app_label=to_label)

    return relabel


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("contenttypes", "0002_remove_content_type_name"),
        ("inference", "0012_batch_api_models_move_to_their_app"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="BatchFile",
                    fields=[
                        (
                            "id",
                            models.UUIDField(
                                default=uuid.uuid4,
                                editable=False,
                                primary_key=True,
                                serialize=False,
                            ),
                        ),
                        (
                            "purpose",
                            models.CharField(
                                choices=[("batch", "Batch input"), ("batch_output", "Batch output")],
                                max_length=16,
                            ),
                        ),
                        ("filename", models.CharField(max_length=255)),
                        (
                            "bytes",
                            models.PositiveBigIntegerField(
                                help_text="Size of the content in bytes."
                            ),
                        ),
                        ("content", models.BinaryField()),
                        (
                            "created_at",
                            models.DateTimeField(
                                db_index=True, default=django.utils.timezone.now
                            ),
                        ),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="batch_files",
                                to="inference.tenant",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name": "batch file",
                        "db_table": "inference_batchfile",
                        "ordering": ["-created_at"],
                    },
                ),
                migrations.CreateModel(
                    name="Batch",
                    fields=[
                        (
                            "id",
                            models.UUIDField(
                                default=uuid.uuid4,
                                editable=False,
                                primary_key=True,
                                serialize=False,
                            ),
                        ),
                        (
                            "endpoint",
                            models.CharField(
                                help_text="The one endpoint all lines call.", max_length=64
                            ),
                        ),
                        ("completion_window", models.CharField(default="24h", max_length=8)),
                        (
                            "status",
                            models.CharField(
                                choices=[
                                    ("validating", "Validating"),
                                    ("failed", "Failed"),
                                    ("in_progress", "In progress"),
                                    ("finalizing", "Finalizing"),
                                    ("completed", "Completed"),
                                    ("expired", "Expired"),
                                    ("cancelling", "Cancelling"),
                                    ("cancelled", "Cancelled"),
                                ],
                                db_index=True,
                                default="validating",
                                max_length=16,
                            ),
                        ),
                        ("metadata", models.JSONField(blank=True, null=True)),
                        (
                            "errors",
                            models.JSONField(
                                blank=True,
                                default=list,
                                help_text="Validation errors, each naming its line.",
                            ),
                        ),
                        ("request_total", models.PositiveIntegerField(default=0)),
                        ("request_completed", models.PositiveIntegerField(default=0)),
                        ("request_failed", models.PositiveIntegerField(default=0)),
                        (
                            "created_at",
                            models.DateTimeField(
                                db_index=True, default=django.utils.timezone.now
                            ),
                        ),
                        ("expires_at", models.DateTimeField()),
                        ("in_progress_at", models.DateTimeField(blank=True, null=True)),
                        ("finalizing_at", models.DateTimeField(blank=True, null=True)),
                        ("completed_at", models.DateTimeField(blank=True, null=True)),
                        ("failed_at", models.DateTimeField(blank=True, null=True)),
                        ("expired_at", models.DateTimeField(blank=True, null=True)),
                        ("cancelling_at", models.DateTimeField(blank=True, null=True)),
                        ("cancelled_at", models.DateTimeField(blank=True, null=True)),
                        (
                            "advanced_at",
                            models.DateTimeField(
                                blank=True,
                                help_text="Last progress step; the sweep restarts a stalled one.",
                                null=True,
                            ),
                        ),
                        (
                            "tenant",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="batches",
                                to="inference.tenant",
                            ),
                        ),
                        (
                            "error_file",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to="batch_api.batchfile",
                            ),
                        ),
                        (
                            "input_file",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.PROTECT,
                                related_name="+",
                                to="batch_api.batchfile",
                            ),
                        ),
                        (
                            "output_file",
                            models.ForeignKey(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="+",
                                to="batch_api.batchfile",
                            ),
                        ),
                    ],
                    options={
                        "verbose_name_plural": "batches",
                        "db_table": "inference_batch",
                        "ordering": ["-created_at"],
                    },
                ),
                migrations.CreateModel(
                    name="BatchRequest",
                    fields=[
                        (
                            "id",
                            models.UUIDField(
                                default=uuid.uuid4,
                                editable=False,
                                primary_key=True,
                                serialize=False,
                            ),
                        ),
                        (
                            "line",
                            models.PositiveIntegerField(
                                help_text="1-based line number in the input file."
                            ),
                        ),
                        ("custom_id", models.CharField(max_length=512)),
                        ("body", models.JSONField()),
                        (
                            "options",
                            models.JSONField(
                                blank=True,
                                default=dict,
                                help_text="How the answer is rendered (encoding, stop...).",
                            ),
                        ),
                        (
                            "error",
                            models.JSONField(
                                blank=True,
                                help_text="Refused at submission: {status_code, code, message}.",
                                null=True,
                            ),
                        ),
                        (
                            "batch",
                            models.ForeignKey(
                                on_delete=django.db.models.deletion.CASCADE,
                                related_name="requests",
                                to="batch_api.batch",
                            ),
                        ),
                        (
                            "job",
                            models.OneToOneField(
                                blank=True,
                                null=True,
                                on_delete=django.db.models.deletion.SET_NULL,
                                related_name="batch_request",
                                to="inference.job",
                            ),
                        ),
                    ],
                    options={
                        "db_table": "inference_batchrequest",
                        "ordering": ["batch", "line"],
                        "indexes": [
                            models.Index(
                                fields=["batch", "line"], name="inference_b_batch_i_9b40bb_idx"
                            )
                        ],
                        "constraints": [
                            models.UniqueConstraint(
                                fields=("batch", "custom_id"), name="batch_custom_id_unique"
                            )
                        ],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(
            relabel_content_types("inference", "batch_api"),
            relabel_content_types("batch_api", "inference"),
        ),
    ]
