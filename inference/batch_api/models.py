"""Files (JSONL stored in Postgres as bytea) and batches with one request row per line.

The tables were created by the inference app's migrations and keep their names (`db_table`).
"""

from __future__ import annotations

import uuid

from django.db import models
from django.utils import timezone


class FilePurpose(models.TextChoices):
    BATCH = "batch", "Batch input"
    BATCH_OUTPUT = "batch_output", "Batch output"


class BatchFile(models.Model):
    """An uploaded or generated file. Content is in Postgres (bytea): no second store to back
    up, and a batch's input and outputs commit with its state."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey(
        "inference.Tenant", on_delete=models.CASCADE, related_name="batch_files"
    )
    purpose = models.CharField(max_length=16, choices=FilePurpose.choices)
    filename = models.CharField(max_length=255)
    bytes = models.PositiveBigIntegerField(help_text="Size of the content in bytes.")
    content = models.BinaryField(editable=False)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        db_table = "inference_batchfile"
        ordering = ["-created_at"]
        verbose_name = "batch file"

    def __str__(self) -> str:
        return f"{self.public_id} ({self.filename})"

    @property
    def public_id(self) -> str:
        return f"file-{self.id.hex}"


class BatchStatus(models.TextChoices):
    VALIDATING = "validating", "Validating"
    FAILED = "failed", "Failed"
    IN_PROGRESS = "in_progress", "In progress"
    FINALIZING = "finalizing", "Finalizing"
    COMPLETED = "completed", "Completed"
    EXPIRED = "expired", "Expired"
    CANCELLING = "cancelling", "Cancelling"
    CANCELLED = "cancelled", "Cancelled"


FINAL_BATCH_STATUSES = (
    BatchStatus.FAILED,
    BatchStatus.COMPLETED,
    BatchStatus.EXPIRED,
    BatchStatus.CANCELLED,
)


class Batch(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    tenant = models.ForeignKey("inference.Tenant", on_delete=models.CASCADE, related_name="batches")
    endpoint = models.CharField(max_length=64, help_text="The one endpoint all lines call.")
    input_file = models.ForeignKey(BatchFile, on_delete=models.PROTECT, related_name="+")
    completion_window = models.CharField(max_length=8, default="24h")
    status = models.CharField(
        max_length=16, choices=BatchStatus.choices, default=BatchStatus.VALIDATING, db_index=True
    )
    metadata = models.JSONField(null=True, blank=True)
    errors = models.JSONField(
        default=list, blank=True, help_text="Validation errors, each naming its line."
    )
    output_file = models.ForeignKey(
        BatchFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    error_file = models.ForeignKey(
        BatchFile, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    request_total = models.PositiveIntegerField(default=0)
    request_completed = models.PositiveIntegerField(default=0)
    request_failed = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    expires_at = models.DateTimeField()
    in_progress_at = models.DateTimeField(null=True, blank=True)
    finalizing_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    expired_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)
    advanced_at = models.DateTimeField(
        null=True, blank=True, help_text="Last progress step; the sweep restarts a stalled one."
    )

    class Meta:
        db_table = "inference_batch"
        ordering = ["-created_at"]
        verbose_name_plural = "batches"

    def __str__(self) -> str:
        return f"{self.public_id} {self.endpoint} {self.status}"

    @property
    def public_id(self) -> str:
        return f"batch_{self.id.hex}"

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_BATCH_STATUSES


class BatchRequest(models.Model):
    """One line of a batch's input file, and the renq job that runs it once submitted."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    batch = models.ForeignKey(Batch, on_delete=models.CASCADE, related_name="requests")
    line = models.PositiveIntegerField(help_text="1-based line number in the input file.")
    custom_id = models.CharField(max_length=512)
    body = models.JSONField()
    job = models.OneToOneField(
        "inference.Job",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="batch_request",
    )
    options = models.JSONField(
        default=dict, blank=True, help_text="How the answer is rendered (encoding, stop...)."
    )
    error = models.JSONField(
        null=True, blank=True, help_text="Refused at submission: {status_code, code, message}."
    )

    class Meta:
        db_table = "inference_batchrequest"
        ordering = ["batch", "line"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "custom_id"], name="batch_custom_id_unique")
        ]
        indexes = [models.Index(fields=["batch", "line"])]

    def __str__(self) -> str:
        return f"{self.batch_id}:{self.line} {self.custom_id}"

    @property
    def public_id(self) -> str:
        return f"batch_req_{self.id.hex}"
