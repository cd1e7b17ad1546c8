"""Closing a month with progress: one `MonthClose` row counts the accounts done out of the
total as they close, so a page (polling) and `manage.py close_month` (a progress bar) show
how far it is and when it will end, and both end with a summary."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import date, datetime
from decimal import Decimal

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.models import Invoice, MonthClose
from billing.services.invoices import invoice_close, invoices_close_month
from billing.services.periods import previous_period
from foundation.enqueue import enqueue
from portal.audit import audit_record
from portal.errors import Conflict, DomainError, PermissionDenied
from portal.models import User

log = logging.getLogger(__name__)


@transaction.atomic
def month_close_start(
    *, actor: User | None, period_start: date | None = None, run_in_background: bool = True
) -> MonthClose:
    """Start closing a month (default: the month before now). Operators (finance) only; one
    close of a month runs at a time. In the background it is a Celery task."""
    if actor is not None and not actor.is_staff:
        raise PermissionDenied("Closing a month is for finance staff.")
    period_start = (period_start or previous_period()).replace(day=1)
    end_of_month = date(
        period_start.year + period_start.month // 12, period_start.month % 12 + 1, 1
    )
    if timezone.now().date() < end_of_month:
        raise DomainError(f"{period_start:%B %Y} has not ended yet.", field="period")
    try:
        with transaction.atomic():
            run = MonthClose.objects.create(period_start=period_start, started_by=actor)
    except IntegrityError:
        raise Conflict(f"{period_start:%B %Y} is already being closed.") from None
    audit_record(
        actor=actor,
        action="billing.month_close.start",
        target=run,
        data={"period": period_start.isoformat()},
    )
    if run_in_background:
        transaction.on_commit(lambda: enqueue("billing.month_close_run", run.pk))
    return run


def month_close_run(
    *,
    close_id: int,
    now: datetime | None = None,
    progress: Callable[[MonthClose], None] | None = None,
) -> MonthClose:
    """Meter, then close every account still open for the month, one transaction each,
    counting as it goes; an account that fails is counted and named in the summary, the
    others still close. Runs once per row (a second call on a finished row does nothing)."""
    run = MonthClose.objects.get(pk=close_id)
    if run.status != MonthClose.Status.RUNNING or run.total is not None:
        return run
    try:
        account_ids = invoices_close_month(period_start=run.period_start, now=now)
    except Exception as exc:
        return _finish(run, status=MonthClose.Status.FAILED, error=str(exc)[:500])
    run.total = len(account_ids)
    run.save(update_fields=["total"])
    if progress is not None:
        progress(run)
    failures: list[dict[str, object]] = []
    for account_id in account_ids:
        try:
            invoice_close(
                account_id=account_id, period_start=run.period_start, now=now, meter=False
            )
            run.done += 1
        except Exception as exc:  # one account's problem must not stop the month's close
            log.exception("closing account %s for %s failed", account_id, run.period_start)
            run.failed += 1
            failures.append({"account": account_id, "error": str(exc)[:300]})
        MonthClose.objects.filter(pk=run.pk).update(done=run.done, failed=run.failed)
        if progress is not None:
            progress(run)
    return _finish(run, status=MonthClose.Status.DONE, failures=failures)


def _finish(
    run: MonthClose,
    *,
    status: str,
    failures: list[dict[str, object]] | None = None,
    error: str = "",
) -> MonthClose:
    invoices = Invoice.objects.filter(period_start=run.period_start).exclude(
        status=Invoice.Status.DRAFT
    )
    totals: dict[str, Decimal] = {}
    for currency, total in invoices.values_list("currency", "total"):
        totals[currency] = totals.get(currency, Decimal(0)) + total
    run.status = status
    run.finished_at = timezone.now()
    run.summary = {
        "invoices": invoices.count(),
        "totals": {c: str(t) for c, t in sorted(totals.items())},
        "accounts_failed": failures or [],
        "seconds": round((run.finished_at - run.started_at).total_seconds(), 1),
        **({"error": error} if error else {}),
    }
    with transaction.atomic():
        run.save(update_fields=["status", "finished_at", "summary", "done", "failed", "total"])
        audit_record(
            actor=None,
            action="billing.month_close.finish",
            target=run,
            data={"status": status, "done": run.done, "failed": run.failed},
        )
    return run
