"""`renq_probe worker --name embedding@$HOSTNAME`: exit 0 when the worker is ready (answers,
consumes its queues, models loaded), else 1 with the reason. A container healthcheck."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from inference.workers.readiness import probe_worker


class Command(BaseCommand):
    help = "Readiness of a Celery worker: answers, consumes its queues, models loaded (exit 0/1)."

    def add_arguments(self, parser):
        parser.add_argument("target", choices=["worker"])
        parser.add_argument("--name", required=True, help="the worker's -n, e.g. embedding@host")
        parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait")

    def handle(self, *args, name: str, timeout: float, **options):
        result = probe_worker(name, timeout_s=timeout)
        if not result.ready:
            raise CommandError(f"not ready: {result.detail}")
        self.stdout.write(f"ready: {result.detail}")
