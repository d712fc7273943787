from django.db import migrations


class Migration(migrations.Migration):
    """The Batch API's models now belong to the batch_api app (its 0001 takes them over).
    State only: the tables, their rows and their keys stay where they are."""

    dependencies = [
        ("inference", "0011_admit_to_queue_function"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="BatchRequest"),
                migrations.DeleteModel(name="Batch"),
                migrations.DeleteModel(name="BatchFile"),
            ],
            database_operations=[],
        ),
    ]
