from django.core.management.base import BaseCommand, CommandError

from inference.jobs.tiers import Plan, Tier
from inference.models import ApiKey, Tenant


class Command(BaseCommand):
    help = "Create a tenant and print its new API key (the key is the last line of output)."

    def add_arguments(self, parser):
        parser.add_argument("name")
        parser.add_argument("--plan", choices=Plan.values, default=Plan.FREE)
        parser.add_argument("--tier", choices=Tier.values, default=Tier.API, help="default tier")

    def handle(self, *args, name: str, plan: str, tier: str, **options):
        if Tenant.objects.filter(name=name).exists():
            raise CommandError(f"tenant '{name}' already exists")
        tenant = Tenant.objects.create(name=name, plan=plan, default_tier=tier)
        _, plaintext = ApiKey.objects.issue(tenant)
        self.stdout.write(f"created tenant {tenant.name} (plan {plan}, default tier {tier})")
        self.stdout.write(plaintext)
