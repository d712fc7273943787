"""`renq_config load FILE` / `renq_config check FILE` / `renq_config dump [-o FILE]`."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from inference.config.file import (
    SECTIONS,
    ConfigFileError,
    apply_config,
    dump_config_yaml,
    file_backend_warnings,
    read_config_file,
)


class Command(BaseCommand):
    help = (
        "Load renq's configuration (models, services, backends, routes, tiers) from a YAML "
        "file, check one without applying it, or dump the live configuration."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        load = sub.add_parser("load", help="validate, then apply in one transaction")
        load.add_argument("path", help="e.g. fixtures/config.yaml")
        load.add_argument(
            "--only",
            default=",".join(SECTIONS),
            help=f"comma-separated sections to apply (default: all of {', '.join(SECTIONS)})",
        )
        check = sub.add_parser("check", help="validate only; exit 1 listing every problem")
        check.add_argument("path")
        dump = sub.add_parser("dump", help="write the live configuration as YAML")
        dump.add_argument("-o", "--output", help="a file (default: standard output)")

    def handle(self, *args, action: str, **options):
        if action == "dump":
            text = dump_config_yaml()
            if options.get("output"):
                with open(options["output"], "w") as handle:
                    handle.write(text)
            else:
                self.stdout.write(text, ending="")
            return
        try:
            doc = read_config_file(options["path"])
        except OSError as exc:
            raise CommandError(str(exc)) from exc
        except ConfigFileError as exc:
            raise CommandError(f"{len(exc.problems)} problem(s) in the file:\n{exc}") from exc
        # Valid, but not every backend usable here (e.g. a key variable unset): say which.
        for warning in file_backend_warnings(doc):
            self.stderr.write(f"warning: {warning}")
        if action == "check":
            self.stdout.write(f"{options['path']}: valid")
            return
        sections = [s.strip() for s in options["only"].split(",") if s.strip()]
        unknown = set(sections) - set(SECTIONS)
        if unknown:
            raise CommandError(f"--only: unknown section(s) {', '.join(sorted(unknown))}")
        try:
            counts = apply_config(doc, sections)
        except ConfigFileError as exc:
            raise CommandError(str(exc)) from exc
        summary = ", ".join(f"{n} {name}" for name, n in counts.items())
        self.stdout.write(f"loaded {summary} from {options['path']}")
