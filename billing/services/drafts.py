"""A month's draft invoice: metering writes usage onto it, the close issues it."""

from __future__ import annotations

from datetime import date

from billing.models import (
    Invoice,
)
from billing.pricing import period_bounds


def invoice_number(account_id: int, period_start: date) -> str:
    """A draft's placeholder number; the issuer's sequence numbers it when it is issued
    (`billing.services.invoices`)."""
    return f"DRAFT-{period_start:%Y%m}-{account_id:06d}"


def draft_invoice(account_id: int, period_start: date) -> Invoice:
    """The account's open page for a month, where metering writes records until the close."""
    invoice, _ = Invoice.objects.get_or_create(
        account_id=account_id,
        period_start=period_start,
        defaults={
            "period_end": period_bounds(period_start)[1].date(),
            "number": invoice_number(account_id, period_start),
            "status": Invoice.Status.DRAFT,
        },
    )
    return invoice
