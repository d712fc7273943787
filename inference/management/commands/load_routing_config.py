"""Kept for existing scripts: `renq_config load FILE --only backends,routes`."""

from django.core.management.base import BaseCommand, CommandError

from inference.config.file import ConfigFileError, load_config_file


class Command(BaseCommand):
    help = (
        "Create or update routing backends and routes from a config file (fixtures/config.yaml); "
        "the file's other sections are validated but not applied."
    )

    def add_arguments(self, parser):
        parser.add_argument("path", help="e.g. fixtures/config.yaml")

    def handle(self, *args, path: str, **options):
        try:
            counts = load_config_file(path, sections=("backends", "routes"))
        except OSError as exc:
            raise CommandError(str(exc)) from exc
        except ConfigFileError as exc:
            raise CommandError(str(exc)) from exc
        self.stdout.write(
            f"loaded {counts['backends']} backends, {counts['routes']} routes, "
            f"{counts['entries']} route entries from {path}"
        )
