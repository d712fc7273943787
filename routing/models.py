"""Backends, routes (ordered cascades with A/B weights), routing decisions and attempts.

A `Backend` is where a job can run: `local` (the renq GPU worker queues, no HTTP) or `openai`
(any OpenAI-compatible HTTP API). A `Route` is one service's cascade of backends. Each job that
went through a route has one `JobRoute` (the current backend and why) and one `JobAttempt` per
backend that tried it.
"""

from __future__ import annotations

import os
from decimal import Decimal

from django.core.exceptions import ValidationError
from django.core.validators import MinValueValidator
from django.db import models

from routing.backends import BackendAdapter, adapter_for, known_service_kinds


class BackendKind(models.TextChoices):
    LOCAL = "local", "Local GPU workers"
    OPENAI = "openai", "OpenAI-compatible HTTP API"


def _validate_service_kinds(value) -> None:
    if not isinstance(value, list) or not value:
        raise ValidationError("must be a non-empty list of service kinds.")
    known = sorted(known_service_kinds())
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ValidationError(
            f"unknown service kind(s) {', '.join(unknown)}; known: {', '.join(known)}."
        )


class Backend(models.Model):
    name = models.SlugField(max_length=60, unique=True, help_text="Shown on jobs and attempts.")
    kind = models.CharField(
        max_length=16,
        choices=BackendKind.choices,
        help_text="local = the renq GPU worker queues; openai = an OpenAI-compatible HTTP API.",
    )
    base_url = models.URLField(
        blank=True,
        default="",
        help_text="API root including the version, e.g. https://api.openai.com/v1 (openai kind).",
    )
    model_name = models.CharField(
        max_length=200, blank=True, default="", help_text="The `model` sent to the API."
    )
    api_key_env = models.CharField(
        "API key environment variable",
        max_length=100,
        blank=True,
        default="",
        help_text="NAME of the environment variable holding the API key; the key is never stored.",
    )
    service_kinds = models.JSONField(
        default=list,
        validators=[_validate_service_kinds],
        help_text='Service kinds this backend can serve, e.g. ["embedding", "llm"].',
    )
    max_context_tokens = models.PositiveIntegerField(
        default=8192,
        help_text="Longest single input it accepts, in estimated tokens: an embedding text, a "
        "query with one document, a prompt with its completion. A local backend's model "
        "truncates each input at its own max length.",
    )
    cost_per_1k_input = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        default=Decimal("0"),
        help_text="USD per 1,000 input tokens (0 for local and free tiers).",
    )
    cost_per_1k_output = models.DecimalField(
        max_digits=12,
        decimal_places=6,
        default=Decimal("0"),
        help_text="USD per 1,000 output tokens.",
    )
    rpm_limit = models.PositiveIntegerField(
        default=0, help_text="Requests allowed per rate window, shared by all workers (0 = none)."
    )
    tpm_limit = models.PositiveIntegerField(
        default=0, help_text="Tokens allowed per rate window, shared by all workers (0 = none)."
    )
    rate_window_s = models.FloatField(
        default=60.0,
        validators=[MinValueValidator(0.1)],
        help_text="Length of the sliding window rpm/tpm count over (60 = per minute).",
    )
    timeout_s = models.FloatField(
        default=30.0, validators=[MinValueValidator(0.01)], help_text="Read timeout of one call."
    )
    connect_timeout_s = models.FloatField(
        default=3.05, validators=[MinValueValidator(0.01)], help_text="TCP connect timeout."
    )
    failure_threshold = models.PositiveIntegerField(
        default=3,
        validators=[MinValueValidator(1)],
        help_text="Consecutive failures (5xx, timeouts, connection errors) that open the breaker.",
    )
    breaker_cooldown_s = models.FloatField(
        default=30.0, help_text="Seconds an open breaker waits before one half-open probe."
    )
    enabled = models.BooleanField(default=True, help_text="Disabled backends are never chosen.")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def adapter(self) -> BackendAdapter:
        return adapter_for(self)

    @property
    def is_free(self) -> bool:
        return not (self.cost_per_1k_input or self.cost_per_1k_output)

    def api_key(self) -> str:
        return os.environ.get(self.api_key_env, "") if self.api_key_env else ""

    def cost_of(self, input_tokens: int, output_tokens: int) -> Decimal:
        return (
            Decimal(input_tokens) * self.cost_per_1k_input
            + Decimal(output_tokens) * self.cost_per_1k_output
        ) / 1000


class Route(models.Model):
    # By string: routing is a library under the job lifecycle and imports nothing from it.
    service = models.OneToOneField(
        "inference.Service",
        on_delete=models.CASCADE,
        related_name="route",
        help_text="A service with no (enabled) route runs on its local queues only, as before.",
    )
    enabled = models.BooleanField(default=True, help_text="Off: the service ignores this route.")

    class Meta:
        ordering = ["service__name"]

    def __str__(self) -> str:
        return f"route for {self.service}"


class RouteEntry(models.Model):
    route = models.ForeignKey(Route, on_delete=models.CASCADE, related_name="entries")
    backend = models.ForeignKey(Backend, on_delete=models.PROTECT, related_name="route_entries")
    order = models.PositiveSmallIntegerField(
        default=0,
        help_text="Cascade position: after a failure the next order is tried. Entries sharing "
        "an order form an A/B group split by weight.",
    )
    weight = models.PositiveIntegerField(
        default=100,
        help_text="Share of its A/B group's traffic. 0 = fallback only (roll a variant back).",
    )

    class Meta:
        ordering = ["order", "id"]
        constraints = [
            models.UniqueConstraint(fields=["route", "backend"], name="routing_entry_once"),
        ]
        verbose_name_plural = "route entries"

    def __str__(self) -> str:
        return f"{self.route.service}#{self.order} → {self.backend} (w={self.weight})"


class JobRoute(models.Model):
    """The routing decision of one job, kept current as the cascade moves it on."""

    job = models.OneToOneField(
        "inference.Job", on_delete=models.CASCADE, primary_key=True, related_name="route"
    )
    backend = models.ForeignKey(
        Backend, on_delete=models.PROTECT, related_name="+", help_text="Backend running it now."
    )
    reason = models.TextField(help_text="Why the router (or the cascade) chose this backend.")
    predicted_local_wait_s = models.FloatField(
        null=True, blank=True, help_text="Predicted wait on the local queues when decided."
    )
    scores = models.JSONField(
        default=dict, blank=True, help_text="Score per candidate backend (lower is better)."
    )
    decided_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.job_id} → {self.backend}"


class AttemptOutcome(models.TextChoices):
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed (retryable)"
    REJECTED = "rejected", "Rejected (final: bad input)"
    RATE_LIMITED = "rate_limited", "Rate limited (429)"
    TIMEOUT = "timeout", "Timed out"
    SKIPPED = "skipped", "Skipped (cooldown, limit or open breaker)"


class JobAttempt(models.Model):
    job = models.ForeignKey(
        "inference.Job", on_delete=models.CASCADE, related_name="routing_attempts"
    )
    backend = models.ForeignKey(Backend, on_delete=models.PROTECT, related_name="attempts")
    started_at = models.DateTimeField(help_text="When this backend started on the job.")
    finished_at = models.DateTimeField(help_text="When this backend's answer (or error) came.")
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices)
    status_code = models.PositiveSmallIntegerField(
        null=True, blank=True, help_text="HTTP status from the upstream, if there was one."
    )
    error = models.TextField(blank=True, default="", help_text="Why it failed.")
    input_tokens = models.PositiveIntegerField(default=0, help_text="As reported by the backend.")
    output_tokens = models.PositiveIntegerField(default=0, help_text="As reported by the backend.")
    cost = models.DecimalField(
        max_digits=14, decimal_places=8, default=Decimal("0"), help_text="USD from token usage."
    )
    worker = models.CharField(max_length=200, blank=True, default="", help_text="host:pid.")

    class Meta:
        ordering = ["job", "started_at", "id"]
        indexes = [models.Index(fields=["backend", "outcome"])]

    def __str__(self) -> str:
        return f"{self.job_id} on {self.backend}: {self.outcome}"
