from __future__ import annotations

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from inference.dispatch.queue_position import explain_wait
from inference.intake.bulk import BULK_TIERS, bulk_progress
from inference.intake.submission import MAX_DEADLINE_MS
from inference.jobs.tiers import Tier
from inference.models import Job, Service


@extend_schema_field({"type": "object", "additionalProperties": True})
class JobInputField(serializers.JSONField):
    """The job's input: an object whose fields depend on the service's kind (see the README)."""


@extend_schema_field(
    {
        "type": "object",
        "nullable": True,
        "additionalProperties": True,
        "description": "The job's result, by service kind (see the README). Embeddings: "
        '`{"embeddings": [[float, ...], ...], "dim": n}`; with `encoding_format=base64` each '
        "vector is a base64 string of its little-endian float32 values (as OpenAI sends them).",
    }
)
class JobResultField(serializers.Field):
    """The job's result as stored, its embedding vectors (kept as float32 bytes, see
    inference.jobs.vectors) encoded as the request asked: `context["encoding_format"]`."""

    def __init__(self, **kwargs):
        super().__init__(source="*", read_only=True, **kwargs)

    def to_representation(self, job: Job) -> dict | None:
        return job.result_body(self.context.get("encoding_format", "float"))


class JobSubmitSerializer(serializers.Serializer):
    """Shape of the request; input is checked against the service kind by the submit service.
    Only documents the body (the views read it with inference.api.intake): unknown fields are
    refused, which inference.api.schema declares (additionalProperties: false)."""

    service = serializers.CharField(min_length=1, max_length=60)
    input = JobInputField()
    # "" and null both mean the tenant's default tier.
    priority = serializers.ChoiceField(
        choices=Tier.values, required=False, allow_null=True, allow_blank=True
    )
    deadline_ms = serializers.IntegerField(
        min_value=1,
        max_value=MAX_DEADLINE_MS,
        required=False,
        allow_null=True,
        help_text="A job not started within this many ms expires (an interactive job's "
        "deadline is never later than the service's total_timeout).",
    )


class BulkJobSubmitSerializer(serializers.Serializer):
    """A bulk job: one list (texts, documents or prompts) split into pieces; batch or offline."""

    service = serializers.CharField(min_length=1, max_length=60)
    input = JobInputField()
    priority = serializers.ChoiceField(
        choices=[str(t) for t in BULK_TIERS], required=False, allow_null=True, allow_blank=True
    )


class BackendAttemptSerializer(serializers.Serializer):
    """One backend's try at the job: the cascade as the tenant sees it."""

    backend = serializers.CharField(source="backend.name")
    outcome = serializers.CharField()
    status_code = serializers.IntegerField(allow_null=True)
    error = serializers.CharField()
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField()
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    cost_usd = serializers.DecimalField(source="cost", max_digits=14, decimal_places=8)


class RequestedPriorityField(serializers.CharField):
    """The tier the request asked for; a job stored before requests kept it: its tier."""

    def __init__(self, **kwargs):
        super().__init__(source="*", read_only=True, **kwargs)

    def to_representation(self, job: Job) -> str:
        return str(job.requested_tier or job.tier)


@extend_schema_field(
    {
        "type": "object",
        "nullable": True,
        "description": "While the job is queued: why it waits and when it should run "
        "(inference.dispatch.queue_position.explain_wait): `position` (jobs the workers serve "
        "first), `work_ahead_tokens`, `running`, `throughput_jobs_s`, `predicted_start` and "
        "`predicted_finish` (ISO 8601), `reason` and every `reasons` (tier_share, "
        "tenant_fair_share, tenant_quota, backend_cooldown, queue_full, next_in_line). "
        "Null once it runs.",
        "additionalProperties": True,
    }
)
class JobWaitField(serializers.Field):
    def __init__(self, **kwargs):
        super().__init__(source="*", read_only=True, **kwargs)

    def to_representation(self, job: Job) -> dict | None:
        return explain_wait(job)


class JobSerializer(serializers.ModelSerializer):
    service = serializers.CharField(source="service.name")
    # The tier it is served in: the requested one after the tenant's plan (its tier boost,
    # its realtime cap); priority_reason says why they differ.
    priority = serializers.CharField(source="tier")
    requested_priority = RequestedPriorityField()
    priority_reason = serializers.CharField(source="tier_reason", read_only=True)
    queue_wait_ms = serializers.FloatField(read_only=True, allow_null=True)
    total_ms = serializers.FloatField(read_only=True, allow_null=True)
    progress = serializers.SerializerMethodField()
    wait = JobWaitField()
    result = JobResultField()
    # Routed jobs (routing/): the backend running it and why; null for unrouted services.
    backend = serializers.CharField(
        source="route.backend.name", read_only=True, default=None, allow_null=True
    )
    route_reason = serializers.CharField(
        source="route.reason", read_only=True, default=None, allow_null=True
    )
    backend_attempts = BackendAttemptSerializer(
        source="routing_attempts", many=True, read_only=True
    )

    class Meta:
        model = Job
        fields = [
            "id",
            "service",
            "priority",
            "requested_priority",
            "priority_reason",
            "status",
            "wait",
            "input",
            "result",
            "error",
            "created_at",
            "started_at",
            "finished_at",
            "queue_wait_ms",
            "inference_ms",
            "total_ms",
            "attempts",
            "batch_size",
            "cached",
            "is_bulk",
            "progress",
            "backend",
            "route_reason",
            "backend_attempts",
        ]

    def get_progress(self, job: Job) -> dict | None:
        """Bulk jobs: pieces done/failed of total (a page's, counted together, in the context
        as `bulk_progress`: bulk_progresses)."""
        if not job.is_bulk:
            return None
        counted = self.context.get("bulk_progress", {})
        return counted[job.pk] if job.pk in counted else bulk_progress(job)


class JobAcceptedSerializer(JobSerializer):
    """The 202 answer to a submission: what the client needs to poll, with no extra queries
    (every query here is paid on the hottest path); a cache hit comes back with its result.
    It documents the answer; the views write it with `accepted_job_body`."""

    backend = serializers.SerializerMethodField()
    route_reason = serializers.SerializerMethodField()

    @staticmethod
    def _route(job: Job):
        # Submission caches the routing decision (or "none") on the job: no query here.
        return job.current_route()

    def get_backend(self, job: Job) -> str | None:
        route = self._route(job)
        return route.backend.name if route else None

    def get_route_reason(self, job: Job) -> str | None:
        route = self._route(job)
        return route.reason if route else None

    class Meta(JobSerializer.Meta):
        fields = [
            "id",
            "service",
            "priority",
            "requested_priority",
            "priority_reason",
            "status",
            "created_at",
            "result",
            "cached",
            "backend",
            "route_reason",
        ]


# The serializer's own rendering of created_at, built once (DRF's ISO 8601, UTC as "Z").
_CREATED_AT = serializers.DateTimeField()


def accepted_job_body(job: Job, encoding_format: str = "float") -> dict:
    """JobAcceptedSerializer's output, field for field, without building a serializer: DRF
    builds a ModelSerializer's fields anew for every instance, on every submission. The two
    are compared in tests/inference/api/test_jobs.py."""
    route = job.current_route()
    return {
        "id": str(job.pk),
        "service": job.service.name,
        "priority": str(job.tier),
        "requested_priority": str(job.requested_tier or job.tier),
        "priority_reason": job.tier_reason,
        "status": str(job.status),
        "created_at": _CREATED_AT.to_representation(job.created_at),
        "result": job.result_body(encoding_format),
        "cached": job.cached,
        "backend": route.backend.name if route else None,
        "route_reason": route.reason if route else None,
    }


def waited_job_body(job: Job, encoding_format: str = "float") -> dict:
    """A POST that waited (?wait=): the accepted body, with how the job ended when it did."""
    body = accepted_job_body(job, encoding_format)
    if hasattr(job, "noticed_backend"):
        body["backend"] = job.noticed_backend  # the backend that ran it (Notice.final_job)
    body["error"] = job.error or None
    body["queue_wait_ms"] = job.queue_wait_ms
    body["inference_ms"] = job.inference_ms
    return body


class JobSummarySerializer(JobSerializer):
    """List view: no input or result bodies (embeddings make pages huge)."""

    class Meta(JobSerializer.Meta):
        fields = [
            f
            for f in JobSerializer.Meta.fields
            # `wait` costs a few queries a job: the job's own page shows it.
            if f not in {"input", "result", "backend_attempts", "wait"}
        ]


class JobResultSerializer(JobSerializer):
    """A job in a batch read (GET /jobs:batchGet): its page without `wait` or
    `backend_attempts`, which cost queries per job (the job's own page shows them)."""

    class Meta(JobSerializer.Meta):
        fields = [f for f in JobSerializer.Meta.fields if f not in {"wait", "backend_attempts"}]


class BatchJobsSerializer(serializers.Serializer):
    jobs = JobResultSerializer(many=True)


class ServiceSerializer(serializers.ModelSerializer):
    runtime = serializers.SerializerMethodField()

    class Meta:
        model = Service
        fields = ["name", "kind", "model_ref", "runtime"]

    def get_runtime(self, service: Service) -> dict:
        return service.runtime()
