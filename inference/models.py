"""Tenants, their API keys, services with runtime settings, and jobs: the record of truth."""

from __future__ import annotations

import hashlib
import secrets
import uuid

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models
from django.dispatch import Signal
from django.utils import timezone

from inference.jobs.status import TERMINAL_STATUSES, JobStatus
from inference.jobs.tiers import PLAN_BOOST, Plan, Tier
from inference.jobs.transitions import JobQuerySet
from inference.jobs.vectors import EmbeddingMatrix, render_result, stored_matrix

# Sent after a bulk UPDATE of services, tenants or keys (a QuerySet.update sends no post_save): the
# configuration change marker moves, so cached copies (inference.intake.lookups) are dropped.
rows_updated = Signal()


class ChangeMarkedQuerySet(models.QuerySet):
    def update(self, **kwargs) -> int:
        updated = super().update(**kwargs)
        if updated:
            rows_updated.send(sender=self.model)
        return updated


class Tenant(models.Model):
    name = models.CharField(max_length=120, unique=True)
    plan = models.CharField(max_length=16, choices=Plan.choices, default=Plan.FREE)
    default_tier = models.CharField(
        "default priority tier",
        max_length=16,
        choices=Tier.choices,
        default=Tier.API,
        help_text="Used when a job does not name a priority.",
    )
    active = models.BooleanField(default=True, help_text="Inactive tenants cannot authenticate.")
    # Quotas, shared by every web process (Redis counters); 0 = no limit.
    requests_per_minute = models.PositiveIntegerField(
        default=0, help_text="Jobs accepted per minute, all services together (0 = no limit)."
    )
    max_running_jobs = models.PositiveIntegerField(
        default=0,
        help_text="Jobs queued or running at once; more are refused with 429 (0 = no limit).",
    )
    monthly_token_budget = models.PositiveBigIntegerField(
        default=0, help_text="Estimated input+output tokens per calendar month (0 = no limit)."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ChangeMarkedQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    # DRF treats the authenticated principal as request.user.
    is_authenticated = True

    @property
    def plan_boost(self) -> int:
        return PLAN_BOOST[self.plan]


class ApiKeyManager(models.Manager.from_queryset(ChangeMarkedQuerySet)):
    def issue(self, tenant: Tenant, label: str = "default") -> tuple[ApiKey, str]:
        """Create a key and return it with its plaintext, which is never stored or shown again."""
        plaintext = "rq_" + secrets.token_urlsafe(32)
        key = self.create(
            tenant=tenant, label=label, prefix=plaintext[:10], hashed_key=ApiKey.hash(plaintext)
        )
        return key, plaintext

    def authenticate(self, plaintext: str) -> ApiKey | None:
        try:
            return self.select_related("tenant").get(
                hashed_key=ApiKey.hash(plaintext), revoked=False, tenant__active=True
            )
        except ApiKey.DoesNotExist:
            return None


class ApiKey(models.Model):
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    label = models.CharField(max_length=80, default="default")
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise a key.")
    # SHA-256, not a slow password hash: keys are 256-bit random, so brute force is moot, and a
    # unique index on the digest makes every authenticated request a single indexed lookup.
    hashed_key = models.CharField(max_length=64, unique=True, editable=False)
    revoked = models.BooleanField(default=False)
    expires_at = models.DateTimeField(
        null=True, blank=True, help_text="After this the key no longer authenticates."
    )
    created_at = models.DateTimeField(auto_now_add=True)

    objects = ApiKeyManager()

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.tenant})"

    @staticmethod
    def hash(plaintext: str) -> str:
        return hashlib.sha256(plaintext.encode()).hexdigest()

    @property
    def expired(self) -> bool:
        return self.expires_at is not None and self.expires_at <= timezone.now()


class ServiceKind(models.TextChoices):
    EMBEDDING = "embedding", "Embedding"
    RERANKER = "reranker", "Reranker"
    LLM = "llm", "LLM"
    NOOP = "noop", "No-op (benchmarks and tests only)"


class Service(models.Model):
    """A named inference service and its runtime settings (the seed config.yaml `runtime:`)."""

    name = models.SlugField(max_length=60, unique=True, help_text="Also the queue name prefix.")
    kind = models.CharField(max_length=16, choices=ServiceKind.choices)
    model_ref = models.CharField(
        max_length=300,
        help_text="package:<python package> or a folder path (relative to the project root).",
    )
    normalize_embeddings = models.BooleanField(
        default=True, help_text="Embedding services: L2-normalise vectors."
    )
    batch_size = models.PositiveIntegerField(default=32, validators=[MinValueValidator(1)])
    batch_timeout = models.FloatField(
        default=0.01,
        validators=[MinValueValidator(0.0)],
        help_text="Seconds a batch may wait for more jobs after its first job arrived.",
    )
    max_total_tokens = models.PositiveIntegerField(
        default=16384, help_text="Token budget of one batch (model tokenizer count)."
    )
    max_queue_size = models.PositiveIntegerField(
        default=500, help_text="Queued jobs above this are refused with 503 and Retry-After."
    )
    worker_count = models.PositiveIntegerField(default=1)
    queue_timeout = models.FloatField(
        default=0.5, help_text="Seconds a realtime/api job may wait before it expires."
    )
    inference_timeout = models.FloatField(default=2.0, help_text="Seconds for one forward pass.")
    total_timeout = models.FloatField(
        default=3.0, help_text="Seconds from submission to result for realtime/api jobs."
    )
    rate_limit = models.PositiveIntegerField(
        default=100, help_text="Jobs per second accepted per tenant for this service (0 = none)."
    )
    preemption_budget_s = models.FloatField(
        null=True,
        blank=True,
        validators=[MinValueValidator(0.001)],
        help_text="Longest predicted run of a non-realtime batch, so a realtime job waits at "
        "most one such batch. Empty = half of total_timeout.",
    )
    enable_cache = models.BooleanField(
        default=False, help_text="Serve identical inputs from earlier results."
    )
    max_items_per_job = models.PositiveIntegerField(
        default=256,
        validators=[MaxValueValidator(100_000)],
        help_text="Most texts/documents one job may carry.",
    )
    active = models.BooleanField(default=True)

    objects = ChangeMarkedQuerySet.as_manager()

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    RUNTIME_FIELDS = (
        "batch_size",
        "batch_timeout",
        "max_total_tokens",
        "max_queue_size",
        "worker_count",
        "queue_timeout",
        "inference_timeout",
        "total_timeout",
        "rate_limit",
        "enable_cache",
    )

    def runtime(self) -> dict:
        return {field: getattr(self, field) for field in self.RUNTIME_FIELDS}

    @property
    def start_promise_s(self) -> float:
        """How long after its acceptance a realtime or api job of the service must start:
        it expires after queue_timeout and promises its answer within total_timeout."""
        return min(self.queue_timeout, self.total_timeout)


class Job(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexed by the composite and partial indexes in Meta, not one index per column.
    tenant = models.ForeignKey(
        Tenant, on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    service = models.ForeignKey(
        Service, on_delete=models.PROTECT, related_name="jobs", db_index=False
    )
    tier = models.CharField(
        max_length=16,
        choices=Tier.choices,
        help_text="The tier it is served in: the requested one after the plan's entitlements.",
    )
    requested_tier = models.CharField(
        max_length=16,
        choices=Tier.choices,
        blank=True,
        default="",
        help_text="The tier the request asked for (empty: the same as tier).",
    )
    tier_reason = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="Why tier differs from the requested tier (the plan's tier boost, its "
        "realtime cap).",
    )
    message_priority = models.PositiveSmallIntegerField(
        default=0, help_text="AMQP priority inside the tier queue (the plan boost)."
    )
    status = models.CharField(
        max_length=16, choices=JobStatus.choices, default=JobStatus.QUEUED
    )
    input = models.JSONField()
    result = models.JSONField(null=True, blank=True)
    # Embedding jobs: the vectors as little-endian float32 bytes (count × dim, row after row);
    # `result` then keeps {"dim", "count"} only. See inference.jobs.vectors.
    result_vectors = models.BinaryField(null=True, blank=True, editable=False)
    error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now, db_index=True)
    published_at = models.DateTimeField(
        null=True, blank=True, help_text=(
            "When the dispatch message was sent: RabbitMQ's confirm, or for a submission "
            "the commit it is published after (cleared if that publish fails)."
        ),
    )
    held_start = models.FloatField(
        null=True, blank=True, editable=False, help_text=(
            "Held back from its tier queue until its turn in the tenant fair share comes "
            "near: its start tag there (no message is out while this is set)."
        ),
    )
    claimed_at = models.DateTimeField(
        null=True, blank=True, help_text="When a worker claimed the job (its batch opened)."
    )
    lease_expires_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="Until when the worker's claim holds: renewed while the worker holds the "
        "job; once it lapses the job is taken over and run elsewhere.",
    )
    started_at = models.DateTimeField(
        null=True, blank=True, help_text="When the forward pass that ran the job began."
    )
    finished_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    # Set by the claim; only the holder of the current token may store the outcome, so a
    # worker that lost its claim (redelivery after a connection loss) cannot overwrite it.
    claim_token = models.UUIDField(null=True, blank=True, editable=False)
    worker = models.CharField(max_length=200, blank=True, default="")
    inference_ms = models.FloatField(null=True, blank=True)
    batch_size = models.PositiveIntegerField(
        null=True, blank=True, help_text="How many jobs shared this job's forward pass."
    )
    input_tokens = models.PositiveIntegerField(null=True, blank=True)
    input_hash = models.CharField(
        max_length=64, blank=True, default="", help_text="SHA-256 of the input, for the cache."
    )
    cached = models.BooleanField(default=False, help_text="Answered from an earlier result.")
    # Bulk jobs: the parent holds the whole input and the assembled result; its pieces are
    # ordinary jobs (so they share the claim/batch path) run as one Celery chord.
    is_bulk = models.BooleanField(default=False)
    parent = models.ForeignKey(
        "self",
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="pieces",
        db_index=False,
    )
    piece_index = models.PositiveIntegerField(null=True, blank=True)
    idempotency_key = models.CharField(
        max_length=200,
        blank=True,
        default="",
        help_text="The client's Idempotency-Key: the same key returns this job for 24 h.",
    )
    deadline_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="An interactive job not started by then expires (deadline_ms tightens the "
        "service's timeouts, never loosens them).",
    )
    serving_tier = models.CharField(
        max_length=16,
        choices=Tier.choices,
        blank=True,
        default="",
        help_text="The tier queue it waits in now, when aging promoted it above its own.",
    )
    dead_lettered_at = models.DateTimeField(
        null=True, blank=True, help_text="When it was given up on and sent to renq.dead."
    )

    # Not stored: its submitter offered its head start, and answers the worker that took it
    # (inference.dispatch.handover).
    head_start_offered = False

    # Every status change goes through the state machine (inference.jobs.transitions).
    objects = JobQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        # Every index is written on each INSERT and on each status change (a status change
        # is never a HOT update), three times in a job's life: only what a query needs, and
        # partial where the rows a query asks for are a small, shrinking share (the active
        # jobs, bulk pieces, cached services' jobs), so index upkeep stays a small part of
        # Postgres's work per job.
        indexes = [
            models.Index(fields=["tenant", "-created_at"]),
            # Queue depth, admission, placement, metrics, sweeps: active jobs only. By tenant,
            # so admission reads each tenant's queued jobs only as far as they count.
            models.Index(
                fields=["service", "status", "tenant"],
                condition=models.Q(status__in=[JobStatus.QUEUED, JobStatus.RUNNING]),
                name="inference_job_active_tenant",
            ),
            models.Index(
                fields=["service", "input_hash", "status"],
                condition=~models.Q(input_hash=""),
                name="inference_job_cache_lookup",
            ),
            models.Index(
                fields=["parent"],
                condition=models.Q(parent__isnull=False),
                name="inference_job_bulk_pieces",
            ),
            # Lease renewal (by worker) and takeover (lapsed leases) read the running jobs.
            models.Index(
                fields=["worker", "lease_expires_at"],
                condition=models.Q(status="running"),
                name="inference_job_running_leases",
            ),
            # Aging and expiry read queued jobs by tier and age every second; finished jobs
            # outnumber them more every day, so the index holds the queued ones alone.
            models.Index(
                fields=["tier", "serving_tier", "created_at"],
                condition=models.Q(status="queued"),
                name="inference_job_queued_by_age",
            ),
            # A tier queue's held-back jobs, read in fair-share order when their turn nears.
            models.Index(
                fields=["service", "held_start"],
                condition=models.Q(status="queued", held_start__isnull=False),
                name="inference_job_held_back",
            ),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "idempotency_key"],
                condition=~models.Q(idempotency_key=""),
                name="inference_job_idempotency_key_once",
            )
        ]


    def current_route(self):
        """The job's routing decision (routing's JobRoute), or None for a service without a
        route."""
        # RelatedObjectDoesNotExist is also an AttributeError.
        return getattr(self, "route", None)

    def current_backend(self):
        """The backend the job's route points at now, or None for a service without a route."""
        route = self.current_route()
        return route.backend if route is not None else None

    def __str__(self) -> str:
        return f"{self.service_id}:{self.id}"

    @property
    def is_terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    @property
    def queue_wait_ms(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.started_at - self.created_at).total_seconds() * 1000

    @property
    def total_ms(self) -> float | None:
        if self.finished_at is None:
            return None
        return (self.finished_at - self.created_at).total_seconds() * 1000

    def result_body(self, encoding_format: str = "float") -> dict | None:
        """The result as clients see it: embeddings as float lists or base64 strings (from
        `result_vectors`), any other kind's result as stored."""
        return render_result(self.result, self.result_vectors, encoding_format)

    def embedding_matrix(self) -> EmbeddingMatrix | None:
        """The job's vectors (None for results without any)."""
        return stored_matrix(self.result, self.result_vectors)


class AuditEventKind(models.TextChoices):
    RECEIVED = "received", "Job received"
    COMPLETED = "completed", "Job completed"
    CANCELLED = "cancelled", "Job cancelled"
    DEAD_LETTERED = "dead_lettered", "Job dead-lettered"
    ADMIN_CHANGE = "admin_change", "Admin change"


class AuditEvent(models.Model):
    """Append-only: who did what to which job or object, and when. Ids, not foreign keys, so
    the trail outlives what it describes."""

    at = models.DateTimeField(default=timezone.now, db_index=True)
    kind = models.CharField(max_length=16, choices=AuditEventKind.choices)
    tenant_id = models.BigIntegerField(null=True, blank=True, db_index=True)
    job_id = models.UUIDField(null=True, blank=True, db_index=True)
    actor = models.CharField(max_length=200, help_text="api:<key prefix>, admin:<user>, worker…")
    detail = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.kind} {self.job_id or ''}"

