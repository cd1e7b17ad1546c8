"""Invoice documents: the context shared by the page, the email and the PDF (WeasyPrint)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.conf import settings
from django.template.loader import render_to_string

from billing import pricing, selectors
from billing.models import Invoice, InvoiceLine
from billing.services.storage_metering import StorageGroup, storage_line_groups
from portal.models import Project

FAULT_POLICY = (
    "Time lost to platform faults is not billed: an allocation that ended because its node was "
    "lost or its GPU failed is credited in full, and so is one preempted from a non-preemptible "
    "job that had no checkpoint directory."
)
ROUNDING = (
    "Usage is metered per second × milli-GPU and priced to 1/1,000,000 USD; each line is the "
    "sum of its usage records rounded half-up to the cent; a fault credit line is the sum of the "
    "credited records of the usage line it offsets, rounded the same way, so fully credited usage "
    "nets to 0.00; tax is rounded half-up to the cent; the total is the sum of the lines. "
    "Storage is a volume's size limit held per second, in GB-months of 730 hours, priced to "
    "1/1,000,000 USD; a storage line is the sum of its records rounded half-up to the cent."
)


def _quantities(invoice: Invoice, lines: list[InvoiceLine]) -> None:
    """Each line's quantity and units as documents print them: GPU-hours at a price per
    GPU-hour for GPU time, GB-months at a price per GB-month for storage (from its records:
    a storage line has no GPU-hours)."""
    storage: dict[tuple[Any, Any], StorageGroup] = {
        (g.period_start, g.rate): g for g in storage_line_groups(invoice)
    }
    kind = InvoiceLine.Kind
    for line in lines:
        quantity, unit, per = line.gpu_hours, "GPU-h", "GPU-h"
        if line.kind == kind.STORAGE:
            group = storage.get((line.usage_period_start, line.unit_price))
            quantity = pricing.gb_months(group.gib_seconds) if group is not None else None
            unit, per = "GB-months", "GB-month"
        elif line.kind in (kind.RESERVED_FEE, kind.TAX):
            per = ""
        line.quantity = quantity  # type: ignore[attr-defined]
        line.quantity_unit = unit if quantity is not None else ""  # type: ignore[attr-defined]
        line.price_unit = per  # type: ignore[attr-defined]


def invoice_context(invoice: Invoice) -> dict[str, Any]:
    lines = list(invoice.lines.select_related("gpu_model").order_by("position"))
    _quantities(invoice, lines)
    jobs = selectors.invoice_job_summary(invoice=invoice)
    for row in jobs:
        row["gpu_hours"] = pricing.gpu_hours(int(row["ms"] or 0))  # type: ignore[call-overload]
        row["amount"] = pricing.to_cents(row["cost"] or pricing.ZERO)  # type: ignore[arg-type]
    due = (invoice.issued_at or invoice.created_at) + timedelta(
        days=settings.BILLING_INVOICE_DUE_DAYS
    )
    return {
        "invoice": invoice,
        "account": invoice.account,
        "projects": list(Project.objects.filter(billing__account=invoice.account).order_by("slug")),
        "lines": lines,
        "jobs": jobs[:200],
        "jobs_more": max(0, len(jobs) - 200),
        "volumes": selectors.invoice_volume_summary(invoice=invoice),
        "due_at": due,
        "provider": settings.BILLING_PROVIDER_NAME,
        "fault_policy": FAULT_POLICY,
        "rounding": ROUNDING,
    }


def render_invoice_pdf(invoice: Invoice) -> bytes:
    from weasyprint import HTML

    html = render_to_string("billing/invoice_pdf.html", invoice_context(invoice))
    pdf: bytes = HTML(string=html).write_pdf()
    return pdf
