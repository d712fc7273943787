from __future__ import annotations

from django.contrib import admin

from routing.costs import costs_by_backend, costs_by_tenant
from routing.models import Backend, JobAttempt, JobRoute, Route, RouteEntry


@admin.register(Backend)
class BackendAdmin(admin.ModelAdmin):
    list_display = (
        "name",
        "kind",
        "model_name",
        "service_kinds",
        "cost_per_1k_input",
        "cost_per_1k_output",
        "rpm_limit",
        "tpm_limit",
        "timeout_s",
        "enabled",
    )
    list_filter = ("kind", "enabled")
    search_fields = ("name", "model_name")


class RouteEntryInline(admin.TabularInline):
    model = RouteEntry
    extra = 1
    fields = ("order", "backend", "weight")


@admin.register(Route)
class RouteAdmin(admin.ModelAdmin):
    list_display = ("service", "enabled", "cascade")
    list_filter = ("enabled",)
    inlines = [RouteEntryInline]

    @admin.display(description="cascade (order: backend ×weight)")
    def cascade(self, route: Route) -> str:
        return " → ".join(
            f"{e.order}: {e.backend.name} ×{e.weight}"
            for e in route.entries.select_related("backend")
        )


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(JobRoute)
class JobRouteAdmin(ReadOnlyAdmin):
    list_display = ("job", "backend", "predicted_local_wait_s", "decided_at", "reason")
    list_filter = ("backend",)
    list_select_related = ("backend",)


@admin.register(JobAttempt)
class JobAttemptAdmin(ReadOnlyAdmin):
    """Attempts, with cost totals per tenant and backend and what routing saved."""

    list_display = (
        "job",
        "backend",
        "outcome",
        "status_code",
        "started_at",
        "finished_at",
        "input_tokens",
        "output_tokens",
        "cost",
        "error",
    )
    list_filter = ("outcome", "backend", "job__tenant")
    list_select_related = ("backend",)
    date_hierarchy = "started_at"
    change_list_template = "admin/routing/jobattempt/change_list.html"

    def changelist_view(self, request, extra_context=None):
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if context is not None and "cl" in context:
            # Totals follow the changelist's filters (date, backend, tenant).
            attempts = context["cl"].queryset
            context["costs_by_tenant"] = costs_by_tenant(attempts)
            context["costs_by_backend"] = costs_by_backend(attempts)
        return response
