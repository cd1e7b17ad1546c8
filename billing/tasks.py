"""Billing tasks: ids in, one service call, idempotent (the ledger's unique keys decide)."""

from __future__ import annotations

from datetime import date

from celery import shared_task

from billing import gateway, services, slurm
from billing.services import month_close, storage_metering


@shared_task(name="billing.meter")  # type: ignore[untyped-decorator]
def meter() -> int:
    return services.usage_meter().records


@shared_task(name="billing.storage_meter")  # type: ignore[untyped-decorator]
def storage_meter() -> int:
    """Volumes' GB-months into the ledger (billing/services/storage_metering.py)."""
    return storage_metering.storage_meter()


@shared_task(name="billing.check_budgets")  # type: ignore[untyped-decorator]
def check_budgets() -> int:
    return len(services.budgets_check())


@shared_task(name="billing.enforce_caps")  # type: ignore[untyped-decorator]
def enforce_caps() -> int:
    """Hard budget caps on running work: notice ahead, then stop (billing/services/budgets.py)."""
    return len(services.budget_caps_enforce().stopped)


@shared_task(name="billing.close_month")  # type: ignore[untyped-decorator]
def close_month(period: str | None = None) -> int:
    """Meter everything, then fan out one close per account for the month before now (or
    `period`, YYYY-MM-DD); each close then skips its own metering."""
    start = date.fromisoformat(period) if period else services.previous_period()
    ids = services.invoices_close_month(period_start=start)
    for account_id in ids:
        close_account.delay(account_id, start.isoformat(), False)
    return len(ids)


@shared_task(name="billing.month_close_run", ignore_result=True, acks_late=False)  # type: ignore[untyped-decorator]
def month_close_run(close_id: int) -> None:
    """A close started from the finance page: its row counts the progress the page polls."""
    month_close.month_close_run(close_id=close_id)


@shared_task(name="billing.close_account")  # type: ignore[untyped-decorator]
def close_account(account_id: int, period: str, meter: bool = True) -> int:
    return services.invoice_close(
        account_id=account_id, period_start=date.fromisoformat(period), meter=meter
    ).pk


@shared_task(
    name="billing.send_invoice_email",
    autoretry_for=(OSError,),
    retry_backoff=True,
    max_retries=5,
)  # type: ignore[untyped-decorator]
def send_invoice_email(invoice_id: int) -> bool:
    return services.invoice_send_email(invoice_id=invoice_id)


@shared_task(
    name="billing.push_invoice_to_stripe",
    autoretry_for=(gateway.GatewayError,),
    retry_backoff=True,
    max_retries=8,
)  # type: ignore[untyped-decorator]
def push_invoice_to_stripe(invoice_id: int) -> str:
    return services.invoice_push_to_stripe(invoice_id=invoice_id)


@shared_task(name="billing.resend_invoices")  # type: ignore[untyped-decorator]
def resend_invoices() -> dict[str, int]:
    """Beat: invoices whose mail or Stripe push has not gone out are enqueued again."""
    due = services.invoices_to_resend()
    for invoice_id in due["email"]:
        send_invoice_email.delay(invoice_id)
    for invoice_id in due["stripe"]:
        push_invoice_to_stripe.delay(invoice_id)
    return {kind: len(ids) for kind, ids in due.items()}


@shared_task(name="billing.slurm_meter", ignore_result=True)
def slurm_meter() -> dict[str, int]:
    """sacct of every Slurm pool → the ledger (every few minutes; re-reading is harmless)."""
    return slurm.meter_recent()
