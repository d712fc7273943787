from __future__ import annotations

from django.contrib import admin

from inference.batch_api.models import Batch, BatchFile


@admin.register(BatchFile)
class BatchFileAdmin(admin.ModelAdmin):
    list_display = ("public_id", "tenant", "purpose", "filename", "bytes", "created_at")
    list_filter = ("purpose",)
    search_fields = ("filename", "tenant__name")
    readonly_fields = ("id", "tenant", "purpose", "filename", "bytes", "created_at")
    # A file's content can be as large as service.MAX_FILE_BYTES: never load it for a list page.
    exclude = ("content",)

    def get_queryset(self, request):
        return super().get_queryset(request).defer("content").select_related("tenant")


@admin.register(Batch)
class BatchAdmin(admin.ModelAdmin):
    list_display = (
        "public_id",
        "tenant",
        "endpoint",
        "status",
        "progress",
        "created_at",
        "completed_at",
    )
    list_filter = ("status", "endpoint")
    search_fields = ("id", "tenant__name")
    readonly_fields = [field.name for field in Batch._meta.fields]
    list_select_related = ("tenant",)

    @admin.display(description="done / failed / total")
    def progress(self, batch: Batch) -> str:
        return f"{batch.request_completed} / {batch.request_failed} / {batch.request_total}"

    def has_add_permission(self, request) -> bool:
        return False  # batches come from the API (POST /v1/batches)
