"""`renq_autoscale [--apply] [--watch S]`: workers each service needs from its queues."""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand

from inference.dispatch.scaling import apply, local_workers, recommend
from inference.jobs.tiers import TIER_ORDER
from inference.models import Service


class Command(BaseCommand):
    help = (
        "Recommend a GPU worker count per service from queue depth, measured throughput and "
        "the tier targets; with --apply, start/stop local worker processes to match."
    )

    def add_arguments(self, parser):
        parser.add_argument("--service", action="append", help="only these services")
        parser.add_argument("--min", type=int, default=1, help="fewest workers per service")
        parser.add_argument("--apply", action="store_true", help="start/stop local workers")
        parser.add_argument("--watch", type=float, default=0, help="repeat every S seconds")

    def handle(self, *args, **options):
        while True:
            self.run_once(options)
            if not options["watch"]:
                return
            time.sleep(options["watch"])

    def run_once(self, options) -> None:
        services = Service.objects.filter(active=True)
        if options["service"]:
            services = services.filter(name__in=options["service"])
        tiers = " ".join(f"{t.value[:8]:>8}" for t in TIER_ORDER)
        self.stdout.write(
            f"{'service':<12} {tiers} {'running':>7} {'jobs/s/w':>9} {'local':>5} "
            f"{'need':>4} {'max':>4} {'recommend':>9}"
        )
        for service in services:
            scale = recommend(service, minimum=options["min"])
            local = len(local_workers(service.name))
            queued = " ".join(f"{scale.queued[t.value]:>8}" for t in TIER_ORDER)
            rate = f"{scale.per_worker_jobs_s:.1f}{'' if scale.measured else '*'}"
            line = (
                f"{service.name:<12} {queued} {scale.running:>7} {rate:>9} {local:>5} "
                f"{scale.needed:>4} {scale.ceiling:>4} {scale.recommended:>9}"
            )
            if options["apply"]:
                started, stopped = apply(scale)
                line += f"   started {started}, stopped {stopped}"
            self.stdout.write(line)
        self.stdout.write("(* = prior from batch_size/batch_timeout; no batch measured yet)")
