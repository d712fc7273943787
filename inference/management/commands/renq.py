"""`manage.py renq submit | status | queues`: the command line over renq_client.

    renq submit --service embedding --file texts.txt --priority batch [--wait] [--ids-out ids]
    renq status --ids ids [--wait]          # or job ids as arguments
    renq queues                             # queued/running per service and tier, consumers

submit and status talk to the REST API (--url / RENQ_URL, --key / RENQ_API_KEY), as any client
would; queues reads Postgres and RabbitMQ, for operators.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from django.core.management.base import BaseCommand, CommandError
from django.db.models import Count

from inference.dispatch.broker import consumer_count
from inference.dispatch.queues import service_tier_queues
from inference.jobs.tiers import TIER_ORDER
from inference.models import Job, JobStatus, Service
from renq_client import BATCH_GET_IDS, RenqClient, RenqError


def _inputs(kind: str, lines: list[str], per_job: int, query: str | None) -> list[dict]:
    groups = [lines[i : i + per_job] for i in range(0, len(lines), per_job)]
    if kind == "embedding":
        return [{"texts": group} for group in groups]
    if kind == "reranker":
        if not query:
            raise CommandError("--query is required for a reranker service")
        return [{"query": query, "documents": group} for group in groups]
    return [{"prompt": line} for line in lines]


def _percentile(values: list[float], q: float) -> str:
    if not values:
        return "-"
    ordered = sorted(values)
    return f"{ordered[min(len(ordered) - 1, int(q * len(ordered)))]:.1f}"


class Command(BaseCommand):
    help = "Submit jobs from a file, follow them, and look at the queues."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        for name in ("submit", "status"):
            p = sub.add_parser(name)
            p.add_argument("--url", default=os.environ.get("RENQ_URL", "http://127.0.0.1:8000"))
            p.add_argument("--key", default=os.environ.get("RENQ_API_KEY", ""))
            p.add_argument("--wait", action="store_true", help="follow the jobs until final")
            p.add_argument("--no-progress", action="store_true")
        submit = sub.choices["submit"]
        submit.add_argument("--service", required=True)
        submit.add_argument("--file", required=True, help="one text (or prompt) per line")
        submit.add_argument("--priority", choices=[t.value for t in TIER_ORDER])
        submit.add_argument("--texts-per-job", type=int, default=1)
        submit.add_argument("--query", help="reranker services: the query for every job")
        submit.add_argument("--ids-out", help="write the job ids here, one per line")
        status = sub.choices["status"]
        status.add_argument("job_ids", nargs="*")
        status.add_argument("--ids", help="a file of job ids (from submit --ids-out)")
        sub.add_parser("queues", help="queued and running jobs per service and tier")

    def handle(self, *args, action: str, **options):
        if action == "queues":
            return self.queues()
        if not options["key"]:
            raise CommandError("an API key is needed: --key or RENQ_API_KEY")
        client = RenqClient(options["url"], options["key"])
        progress = not options["no_progress"]
        try:
            if action == "submit":
                ids = self.submit(client, options, progress)
            else:
                ids = list(options["job_ids"])
                if options["ids"]:
                    ids += Path(options["ids"]).read_text().split()
                if not ids:
                    raise CommandError("no job ids: pass them or --ids FILE")
            if action == "status" or options["wait"]:
                self.report(client, ids, wait=options["wait"], progress=progress)
        except RenqError as exc:
            raise CommandError(str(exc)) from exc

    def submit(self, client: RenqClient, options, progress: bool) -> list[str]:
        lines = [line.strip() for line in Path(options["file"]).read_text().splitlines()]
        lines = [line for line in lines if line]
        kind = next((s["kind"] for s in client.services() if s["name"] == options["service"]), None)
        if kind is None:
            raise CommandError(f"no service {options['service']!r}")
        inputs = _inputs(kind, lines, max(1, options["texts_per_job"]), options["query"])
        ids = client.bulk(
            options["service"], inputs, priority=options["priority"], progress=progress
        )
        if options["ids_out"]:
            Path(options["ids_out"]).write_text("\n".join(ids) + "\n")
        rejected = f", {len(client.stats.rejected)} rejected" if client.stats.rejected else ""
        waited = (
            f"; waited {client.stats.waited_s:.0f} s on {client.stats.retries} 429/503 answers"
            if client.stats.retries
            else ""
        )
        self.stdout.write(f"submitted {len(ids)} jobs ({len(lines)} lines){rejected}{waited}")
        return ids

    def report(self, client: RenqClient, ids: list[str], *, wait: bool, progress: bool) -> None:
        if wait:
            jobs = list(client.results(ids, progress=progress))
        else:
            chunks = [ids[i : i + BATCH_GET_IDS] for i in range(0, len(ids), BATCH_GET_IDS)]
            jobs = [job for chunk in chunks for job in client.get_many(chunk)]
        by_status = Counter(job["status"] for job in jobs)
        waits = [j["queue_wait_ms"] for j in jobs if j.get("queue_wait_ms") is not None]
        infer = [j["inference_ms"] for j in jobs if j.get("inference_ms") is not None]
        backends = Counter(j.get("backend") or "local" for j in jobs if j["status"] == "succeeded")
        self.stdout.write(f"{'status':<10} {'jobs':>6}")
        for status, count in by_status.most_common():
            self.stdout.write(f"{status:<10} {count:>6}")
        self.stdout.write(
            f"queue wait ms p50 {_percentile(waits, 0.5)} p95 {_percentile(waits, 0.95)}; "
            f"inference ms p50 {_percentile(infer, 0.5)}; "
            f"backends {', '.join(f'{b} {n}' for b, n in backends.most_common()) or '-'}"
        )

    def queues(self) -> None:
        counts = Counter()
        rows = (
            Job.objects.filter(status__in=[JobStatus.QUEUED, JobStatus.RUNNING], is_bulk=False)
            .values_list("service__name", "tier", "status")
            .annotate(n=Count("pk"))
            .order_by()
        )
        for service, tier, status, n in rows:
            counts[(service, tier if status == JobStatus.QUEUED else "running")] += n
        tiers = [t.value for t in TIER_ORDER]
        header = " ".join(f"{t:>9}" for t in [*tiers, "running"])
        # Consumers on the tier queues: a worker has one on each of the four.
        self.stdout.write(f"{'service':<14} {header} {'consumers':>9}")
        for service in Service.objects.filter(active=True):
            row = " ".join(f"{counts[(service.name, t)]:>9}" for t in [*tiers, "running"])
            consumers = consumer_count(service_tier_queues(service.name))
            self.stdout.write(f"{service.name:<14} {row} {consumers:>9}")
