"""Late facts: what is learned after a month was invoiced never rewrites that invoice.

An issued invoice and its usage records are immutable (a PostgreSQL trigger refuses any change
to their money); a correction goes onto the account's next invoice as an adjustment that
points to the invoice (and allocation) it corrects.
"""

from __future__ import annotations

from decimal import Decimal

from django.db.models import Sum

from billing import pricing
from billing.models import UNISSUED_STATUSES, Adjustment, Invoice, UsageRecord
from portal.audit import audit_record
from scheduler.models import Allocation


def usage_fault_credit(*, alloc: Allocation, account_id: int) -> list[Adjustment]:
    """Apply the fault policy to an allocation's records. Those still on a draft are marked
    credited (the close offsets them line by line); those on an issued invoice stay as
    invoiced, and each such invoice gets a credit adjustment on the next invoice pointing to
    it and to the allocation (once: unique per allocation and invoice)."""
    UsageRecord.objects.filter(allocation=alloc, invoice__status=Invoice.Status.DRAFT).update(
        fault_credit=True
    )
    adjustments = []
    invoiced = (
        UsageRecord.objects.filter(allocation=alloc, fault_credit=False)
        .exclude(invoice__status__in=UNISSUED_STATUSES)
        .values("invoice_id", "invoice__number")
        .annotate(total=Sum("amount"))
        .order_by("invoice_id")
    )
    for row in invoiced:
        amount = pricing.to_cents(row["total"] or Decimal(0))
        if amount <= 0:
            continue
        adjustment, created = Adjustment.objects.get_or_create(
            source_allocation=alloc,
            source_invoice_id=row["invoice_id"],
            defaults={
                "account_id": account_id,
                "amount": -amount,
                "description": (
                    f"Platform fault credit, job #{alloc.job_id} "
                    f"({alloc.get_end_reason_display()}): usage invoiced on "
                    f"{row['invoice__number']}"
                ),
            },
        )
        if created:
            adjustments.append(adjustment)
            audit_record(
                actor=None,
                action="billing.adjustment.fault_correction",
                target=adjustment,
                data={"invoice": row["invoice_id"], "allocation": alloc.pk, "amount": str(-amount)},
            )
    audit_record(
        actor=None,
        action="billing.usage.fault_credit",
        target=alloc,
        data={
            "end_reason": alloc.end_reason,
            "job": alloc.job_id,
            "corroborated_at": alloc.fault_corroborated_at.isoformat()
            if alloc.fault_corroborated_at
            else None,
        },
    )
    return adjustments
