"""`python manage.py close_month [--period YYYY-MM-DD]`: close a month here, with a progress
bar (accounts done / total, ETA) and a summary at the end."""

from __future__ import annotations

import sys
from datetime import date
from typing import Any, TextIO, cast

from django.core.management.base import BaseCommand, CommandError, CommandParser

from billing.models import MonthClose
from billing.services.month_close import month_close_run, month_close_start
from portal.errors import DomainError
from scheduler.core.cli import ProgressBar


class Command(BaseCommand):
    help = "Close a month's invoices (default: last month) with progress and a summary."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--period", help="any day of the month to close, YYYY-MM-DD")
        parser.add_argument("--progress", choices=("auto", "always", "never"), default="auto")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            period = date.fromisoformat(options["period"]) if options["period"] else None
        except ValueError:
            raise CommandError("--period is a date: YYYY-MM-DD") from None
        try:
            run = month_close_start(actor=None, period_start=period, run_in_background=False)
        except DomainError as exc:
            raise CommandError(exc.message) from None
        err = cast(TextIO, self.stderr._out)  # the real stream, for \r redraws
        wanted = options["progress"] == "always" or (
            options["progress"] == "auto" and getattr(err, "isatty", lambda: False)()
        )
        bar = ProgressBar(err, unit="accounts") if wanted else None

        def progress(r: MonthClose) -> None:
            if bar is not None and r.total is not None:
                bar(r.processed, r.total)

        run = month_close_run(close_id=run.pk, progress=progress)
        if bar is not None:
            bar.close()
        s = run.summary
        totals = ", ".join(f"{t} {c.upper()}" for c, t in s.get("totals", {}).items()) or "0"
        self.stdout.write(
            f"Closed {run.period_start:%B %Y}: {run.done} of {run.total or 0} accounts closed, "
            f"{run.failed} failed; {s.get('invoices', 0)} invoices issued for the month, "
            f"totalling {totals}; {s.get('seconds', 0)} s."
        )
        for failure in s.get("accounts_failed", []):
            self.stderr.write(f"  account {failure['account']}: {failure['error']}")
        if run.status == MonthClose.Status.FAILED:
            raise CommandError(f"The close failed: {s.get('error', '')}")
        if run.failed:
            sys.exit(1)
