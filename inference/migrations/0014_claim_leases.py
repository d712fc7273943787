from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("inference", "0013_job_requested_tier"),
    ]

    operations = [
        migrations.AddField(
            model_name="job",
            name="lease_expires_at",
            field=models.DateTimeField(
                blank=True,
                null=True,
                help_text="Until when the worker's claim holds: renewed while the worker holds "
                "the job; once it lapses the job is taken over and run elsewhere.",
            ),
        ),
        migrations.AddIndex(
            model_name="job",
            index=models.Index(
                condition=models.Q(("status", "running")),
                fields=["worker", "lease_expires_at"],
                name="inference_job_running_leases",
            ),
        ),
        # Claims taken before leases existed keep the old stale-claim floor as their lease.
        migrations.RunSQL(
            "UPDATE inference_job SET lease_expires_at = claimed_at + interval '120 seconds'"
            " WHERE status = 'running' AND claim_token IS NOT NULL",
            migrations.RunSQL.noop,
        ),
    ]
