# Embedding vectors stored as little-endian float32 bytes instead of JSON float lists.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('inference', '0005_noop_kind'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='result_vectors',
            field=models.BinaryField(blank=True, editable=False, null=True),
        ),
    ]
