from django.core.management.base import BaseCommand, CommandError

from routing.config import ConfigError, load_routing_file


class Command(BaseCommand):
    help = "Create or update routing backends and routes from a YAML file."

    def add_arguments(self, parser):
        parser.add_argument("path", help="e.g. fixtures/routing.yaml")

    def handle(self, *args, path: str, **options):
        try:
            counts = load_routing_file(path)
        except (OSError, ConfigError) as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"loaded {counts['backends']} backends, {counts['routes']} routes, "
            f"{counts['entries']} route entries from {path}"
        )
