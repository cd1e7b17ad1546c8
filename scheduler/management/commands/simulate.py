"""`python manage.py simulate ...`: thin wrapper around `scheduler.core.cli.main`."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from scheduler.core.cli import main


class Command(BaseCommand):
    help = "Replay cluster traces through the scheduler core (packing, queue)."

    def run_from_argv(self, argv: list[str]) -> None:
        # argv: ["manage.py", "simulate", ...]; argparse in the core handles the rest
        code = main(argv[2:])
        if code:
            raise SystemExit(code)

    def handle(self, *args: str, **options: object) -> None:  # call_command("simulate")
        raise CommandError("run as: python manage.py simulate {packing,queue} ...")
