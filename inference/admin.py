from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, Min, Q, Sum
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_safe

from inference.config.plans import plan_policy
from inference.dispatch.queue_position import (
    ACTIVE_STATUSES,
    ESTIMATED_TOKENS,
    WAIT_REASONS,
    queue_full_for,
    tenants_at_quota,
    wait_reasons,
)
from inference.intake.submission import cancel_job, requeue_dead_lettered
from inference.jobs.tiers import TIER_ORDER
from inference.metrics.queue_depth import WAITING_TIER, tenant_depths
from inference.models import ApiKey, AuditEvent, Job, JobStatus, Service, Tenant

admin.site.site_header = "renq administration"
admin.site.site_title = "renq admin"
# The index links the queue pages (renq_site.urls serves them through admin.site.admin_view).
admin.site.index_template = "inference/admin/index.html"


class ApiKeyInline(admin.TabularInline):
    model = ApiKey
    extra = 0
    fields = ("label", "prefix", "revoked", "expires_at", "created_at")
    readonly_fields = ("prefix", "created_at")


@admin.register(Tenant)
class TenantAdmin(admin.ModelAdmin):
    list_display = ("name", "plan", "entitlement", "default_tier", "active", "created_at")
    list_filter = ("plan", "default_tier", "active")
    search_fields = ("name",)
    readonly_fields = ("entitlement",)
    inlines = [ApiKeyInline]

    @admin.display(description="plan entitlement")
    def entitlement(self, tenant: Tenant) -> str:
        # What the plan's policy (the plan policies page, config.yaml `plans:`) gives it now.
        policy = plan_policy(tenant.plan)
        cap = "none" if policy.realtime_cap is None else f"{policy.realtime_cap} jobs/s"
        return f"tier {policy.tier_boost:+d}, weight {policy.weight:g}, realtime cap {cap}"

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


# --- the queue pages: what waits where, for whom, and why ----------------------------------

# The window of "served share": long enough to hold several batches of every tenant.
SERVED_WINDOW = timedelta(minutes=5)


@dataclass
class QueueLine:
    """One tenant's work in one tier queue of a service."""

    tier: str
    tenant: str
    plan: str
    queued: int
    tokens: int
    running: int
    oldest_wait_s: float | None
    reasons: list[str] = field(default_factory=list)
    bar_pct: float = 0.0


@dataclass
class ServedShare:
    tenant: str
    plan: str
    finished: int
    share_pct: float


def _wait_s(now: datetime, oldest: datetime | None) -> float | None:
    return None if oldest is None else max(0.0, (now - oldest).total_seconds())


def _pct(part: float, whole: float) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0


def service_queue_lines(service: Service, now: datetime) -> list[QueueLine]:
    """Queued and running work of a service by tier queue and tenant, each line with the reasons
    its jobs wait: a few GROUP BYs, whatever the backlog."""
    rows = list(
        Job.objects.filter(service=service, status__in=ACTIVE_STATUSES, is_bulk=False)
        .annotate(waiting_tier=WAITING_TIER)
        .values("waiting_tier", "tenant_id", "tenant__name", "tenant__plan")
        .annotate(
            queued=Count("id", filter=Q(status=JobStatus.QUEUED)),
            running=Count("id", filter=Q(status=JobStatus.RUNNING)),
            tokens=Sum(ESTIMATED_TOKENS, filter=Q(status=JobStatus.QUEUED)),
            oldest=Min("created_at", filter=Q(status=JobStatus.QUEUED)),
        )
    )
    # Admission's own counts: the service's queued jobs by tenant, and each tenant's queued
    # and running jobs on every service (bulk pieces aside), against its max_running_jobs.
    depths = tenant_depths(service)
    at_quota = tenants_at_quota({row["tenant_id"] for row in rows})
    tenants_by_tier: dict[str, set[int]] = {}
    for row in rows:
        if row["queued"]:
            tenants_by_tier.setdefault(row["waiting_tier"], set()).add(row["tenant_id"])
    queued_tiers = set(tenants_by_tier)
    rank = {tier.value: tier.rank for tier in TIER_ORDER}
    most = max((row["queued"] for row in rows), default=0)
    lines = []
    for row in sorted(rows, key=lambda r: (rank[r["waiting_tier"]], -r["queued"])):
        tier = row["waiting_tier"]
        reasons = []
        if row["queued"]:
            reasons = wait_reasons(
                queue_full=queue_full_for(service, row["tenant_id"], tier, depths),
                at_quota=row["tenant_id"] in at_quota,
                higher_tiers_waiting=any(rank[other] < rank[tier] for other in queued_tiers),
                other_tenants_waiting=bool(tenants_by_tier[tier] - {row["tenant_id"]}),
            )
        lines.append(
            QueueLine(
                tier=tier,
                tenant=row["tenant__name"],
                plan=row["tenant__plan"],
                queued=row["queued"],
                tokens=int(row["tokens"] or 0),
                running=row["running"],
                oldest_wait_s=_wait_s(now, row["oldest"]),
                reasons=reasons,
                bar_pct=_pct(row["queued"], most),
            )
        )
    return lines


def served_shares(service: Service, now: datetime) -> list[ServedShare]:
    """Each tenant's share of the service's jobs finished over SERVED_WINDOW."""
    rows = list(
        Job.objects.filter(service=service, finished_at__gte=now - SERVED_WINDOW, is_bulk=False)
        .values("tenant__name", "tenant__plan")
        .annotate(finished=Count("id"))
        .order_by("-finished", "tenant__name")
    )
    total = sum(row["finished"] for row in rows)
    return [
        ServedShare(
            row["tenant__name"], row["tenant__plan"], row["finished"], _pct(row["finished"], total)
        )
        for row in rows
    ]


def _require_job_view(request: HttpRequest) -> None:
    if not request.user.has_perm("inference.view_job"):
        raise PermissionDenied


@require_safe
def queues_view(request: HttpRequest) -> HttpResponse:
    """Every service's queue at a glance: one GROUP BY for the active jobs, one for the
    finished ones."""
    _require_job_view(request)
    now = timezone.now()
    active = {
        row["service_id"]: row
        for row in Job.objects.filter(status__in=ACTIVE_STATUSES, is_bulk=False)
        .values("service_id")
        .annotate(
            queued=Count("id", filter=Q(status=JobStatus.QUEUED)),
            running=Count("id", filter=Q(status=JobStatus.RUNNING)),
            oldest=Min("created_at", filter=Q(status=JobStatus.QUEUED)),
        )
    }
    finished = dict(
        Job.objects.filter(finished_at__gte=now - SERVED_WINDOW, is_bulk=False)
        .values("service_id")
        .annotate(n=Count("id"))
        .values_list("service_id", "n")
    )
    services = []
    for service in Service.objects.order_by("name"):
        row = active.get(service.pk, {})
        queued = row.get("queued", 0)
        services.append(
            {
                "service": service,
                "queued": queued,
                "running": row.get("running", 0),
                "oldest_wait_s": _wait_s(now, row.get("oldest")),
                "finished": finished.get(service.pk, 0),
                "fill_pct": min(100.0, _pct(queued, service.max_queue_size)),
            }
        )
    context = {
        **admin.site.each_context(request),
        "title": "Queues",
        "services": services,
        "window_min": int(SERVED_WINDOW.total_seconds() // 60),
    }
    return render(request, "inference/admin/queues.html", context)


@require_safe
def service_queue_view(request: HttpRequest, service: str) -> HttpResponse:
    """One service: its work by tier and tenant, why it waits, and who was served lately."""
    _require_job_view(request)
    found = get_object_or_404(Service, name=service)
    now = timezone.now()
    lines = service_queue_lines(found, now)
    tiers = []
    for tier in TIER_ORDER:
        mine = [line for line in lines if line.tier == tier.value]
        tiers.append(
            {
                "tier": tier,
                "lines": mine,
                "queued": sum(line.queued for line in mine),
                "running": sum(line.running for line in mine),
                "tokens": sum(line.tokens for line in mine),
                "oldest_wait_s": max(
                    (line.oldest_wait_s for line in mine if line.oldest_wait_s is not None),
                    default=None,
                ),
            }
        )
    used_reasons = {reason for line in lines for reason in line.reasons}
    context = {
        **admin.site.each_context(request),
        "title": f"Queue of {found.name}",
        "service": found,
        "tiers": tiers,
        "queued": sum(line.queued for line in lines),
        "running": sum(line.running for line in lines),
        "served": served_shares(found, now),
        "window_min": int(SERVED_WINDOW.total_seconds() // 60),
        "reasons": [(name, text) for name, text in WAIT_REASONS.items() if name in used_reasons],
        "reason_text": WAIT_REASONS,
    }
    return render(request, "inference/admin/service_queue.html", context)
