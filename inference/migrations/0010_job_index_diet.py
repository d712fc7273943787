"""Fewer, partial indexes on the job table (see Job.Meta): each index is written on every
INSERT and status change. The new indexes are built concurrently, before the old ones go, so
submissions keep being accepted and queries keep an index while this runs on a large table."""

import django.db.models.deletion
from django.contrib.postgres.operations import AddIndexConcurrently, RemoveIndexConcurrently
from django.db import migrations, models


class Migration(migrations.Migration):
    # CREATE/DROP INDEX CONCURRENTLY cannot run inside a transaction.
    atomic = False

    dependencies = [
        ("inference", "0009_queue_depth_function"),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status__in", ["queued", "running"])),
                fields=["service", "status"],
                name="inference_job_active",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("input_hash", ""), _negated=True),
                fields=["service", "input_hash", "status"],
                name="inference_job_cache_lookup",
            ),
        ),
        AddIndexConcurrently(
            model_name="job",
            index=models.Index(
                condition=models.Q(("parent__isnull", False)),
                fields=["parent"],
                name="inference_job_bulk_pieces",
            ),
        ),
        RemoveIndexConcurrently(model_name="job", name="inference_j_service_df7289_idx"),
        RemoveIndexConcurrently(model_name="job", name="inference_j_service_168129_idx"),
        migrations.AlterField(
            model_name="job",
            name="parent",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="pieces",
                to="inference.job",
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="service",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="jobs",
                to="inference.service",
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="status",
            field=models.CharField(
                choices=[
                    ("queued", "Queued"),
                    ("running", "Running"),
                    ("succeeded", "Succeeded"),
                    ("failed", "Failed"),
                    ("expired", "Expired"),
                    ("cancelled", "Cancelled"),
                ],
                default="queued",
                max_length=16,
            ),
        ),
        migrations.AlterField(
            model_name="job",
            name="tenant",
            field=models.ForeignKey(
                db_index=False,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="jobs",
                to="inference.tenant",
            ),
        ),
    ]
