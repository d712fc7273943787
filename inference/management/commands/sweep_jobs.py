from django.core.management.base import BaseCommand

from inference.workers.sweeper import sweep_jobs


class Command(BaseCommand):
    help = "Republish unconfirmed jobs, recover dead workers' claims, expire overdue jobs."

    def handle(self, *args, **options):
        self.stdout.write(str(sweep_jobs()))
