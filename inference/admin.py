from __future__ import annotations

from django.contrib import admin, messages
from django.http import HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html

from inference.intake.submission import cancel_job, requeue_dead_lettered
from inference.models import ApiKey, AuditEvent, Job, JobStatus, Service, Tenant


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ("label", "prefix", "revoked", "expires_at", "created_at")
    readonly_fields = ("prefix", "created_at")


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("name", "plan", "default_tier", "active", "created_at")
    list_filter = ("plan", "default_tier", "active")
    search_fields = ("name",)
    inlines = [ApiKeyInline]

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        if not change:
            _, plaintext = ApiKey.objects.issue(obj)
            messages.warning(
                request,
                format_html(
                    "API key for {}: <code>{}</code> — copy it now, it is not shown again.",
                    obj.name,
                    plaintext,
                ),
            )


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("prefix", "tenant", "label", "revoked", "created_at")
    list_filter = ("revoked",)
    fields = ("tenant", "label", "prefix", "revoked", "created_at")
    readonly_fields = ("prefix", "created_at")
    actions = ["revoke"]

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        _, plaintext = ApiKey.objects.issue(obj.tenant, label=obj.label)
        messages.warning(request, f"New API key: {plaintext} — copy it now, it is not shown again.")

    def response_add(self, request, obj, post_url_continue=None):
        return HttpResponseRedirect(reverse("admin:inference_apikey_changelist"))

    @admin.action(description="Revoke selected keys")
    def revoke(self, request, queryset):
        queryset.update(revoked=True)


@admin.register(Service)
class ServiceAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "kind",
        "model_ref",
        "batch_size",
        "batch_timeout",
        "max_queue_size",
        "worker_count",
        "queue_timeout",
        "rate_limit",
        "enable_cache",
        "active",
    )
    list_filter = ("kind", "active")


class DeadLetteredFilter(admin.SimpleListFilter):
    title = "dead-lettered"
    parameter_name = "dead_lettered"

    def lookups(self, request, model_admin):
        return [("yes", "Dead-lettered"), ("no", "Not dead-lettered")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(dead_lettered_at__isnull=False)
        if self.value() == "no":
            return queryset.filter(dead_lettered_at__isnull=True)
        return queryset


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "tenant",
        "service",
        "tier",
        "status",
        "created_at",
        "queue_wait",
        "inference_time",
        "batch_size",
        "backend",
        "attempts",
    )
    list_filter = (
        "status",
        DeadLetteredFilter,
        "tier",
        "service",
        "tenant",
        ("route__backend", admin.RelatedOnlyFieldListFilter),
    )
    search_fields = ("id",)
    date_hierarchy = "created_at"
    # The vectors' bytes are summarised (count × dim), not printed.
    readonly_fields = [
        "vectors" if f.name == "result_vectors" else f.name for f in Job._meta.fields
    ]
    actions = ["cancel_jobs", "requeue_dead_lettered"]
    # The backend shown per row comes with the page's one query (JobRoute is one-to-one).
    list_select_related = ("tenant", "service", "route__backend")

    def has_add_permission(self, request) -> bool:
        # Jobs enter through the submit service only (validation, admission, publishing).
        return False

    @admin.display(description="inference (ms)", ordering="inference_ms")
    def inference_time(self, job: Job):
        return None if job.inference_ms is None else round(job.inference_ms, 1)

    @admin.display(description="backend", ordering="route__backend__name")
    def backend(self, job: Job) -> str:
        route = getattr(job, "route", None)
        return route.backend.name if route else "local (no route)"

    @admin.display(description="result vectors")
    def vectors(self, job: Job) -> str:
        matrix = job.embedding_matrix()
        if matrix is None or job.result_vectors is None:
            return "-"
        return f"{matrix.count} × {matrix.dim} float32 ({len(job.result_vectors):,} bytes)"

    @admin.display(description="queue wait (ms)")
    def queue_wait(self, job: Job):
        wait = job.queue_wait_ms
        return None if wait is None else round(wait, 1)

    @admin.action(description="Cancel selected queued jobs")
    def cancel_jobs(self, request, queryset):
        actor = f"admin:{request.user}"
        cancelled = sum(
            cancel_job(job, actor=actor) for job in queryset.filter(status=JobStatus.QUEUED)
        )
        self.message_user(request, f"Cancelled {cancelled} job(s).")

    @admin.action(description="Requeue selected dead-lettered jobs")
    def requeue_dead_lettered(self, request, queryset):
        revived = requeue_dead_lettered(queryset, actor=f"admin:{request.user}")
        self.message_user(request, f"Requeued {revived} dead-lettered job(s).")


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """The audit trail, read-only: rows are only ever appended."""

    list_display = ("at", "kind", "tenant_id", "job_id", "actor")
    list_filter = ("kind",)
    search_fields = ("job_id", "actor")
    date_hierarchy = "at"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

