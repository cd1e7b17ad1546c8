"""Invoices: closing a month (in named steps), its PDF, the accounts still to close."""

from __future__ import annotations

from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count, F, Q, Sum
from django.utils import timezone

from billing import gateway, pricing
from billing.models import (
    Adjustment,
    BillingAccount,
    CreditApplication,
    Invoice,
    InvoiceLine,
    InvoiceSequence,
    ProjectBilling,
    ReservedPlan,
    Tier,
    UsageRecord,
)
from billing.pricing import period_bounds
from billing.services.accounts import account_currency
from billing.services.coverage import usage_apply_coverage
from billing.services.credits import credit_draws
from billing.services.drafts import draft_invoice
from billing.services.metering import usage_meter
from billing.services.periods import previous_period
from billing.services.storage_metering import storage_line_groups, storage_meter
from foundation.enqueue import enqueue
from portal.audit import audit_record
from portal.errors import DomainError


class _Lines:
    def __init__(self, invoice: Invoice) -> None:
        self.invoice = invoice
        self.rows: list[InvoiceLine] = []

    def add(self, kind: str, description: str, amount: Decimal, **extra: Any) -> InvoiceLine:
        line = InvoiceLine(
            invoice=self.invoice,
            position=len(self.rows) + 1,
            kind=kind,
            description=description[:300],
            amount=amount,
            **extra,
        )
        self.rows.append(line)
        return line

    @property
    def total(self) -> Decimal:
        return pricing.sum_amounts(line.amount for line in self.rows)


@transaction.atomic
def invoice_close(
    *, account_id: int, period_start: date, now: datetime | None = None, meter: bool = True
) -> Invoice:
    """Close a month for one account: meter (unless the caller just metered everything), cover,
    and issue the month's invoice with its lines. Metering writes records onto the month's
    draft invoice; the close prices what is on it and issues it, so no record is ever moved.
    Idempotent: an account's month is issued once (unique per account and month).

    The lines come in this order, one step each: reserved fees, covered usage, usage (pay as
    you go, preemptible, late), fault credits (one per usage line it offsets), adjustments,
    credits drawn, tax (always, even at 0 %), and a negative balance carried forward. An
    account with nothing to bill (no usage, fee, adjustment) gets no invoice: the month is
    marked "nothing to bill", takes no number and is neither mailed nor sent to Stripe."""
    now = now or timezone.now()
    start, end = period_bounds(period_start)
    if now < end:
        raise DomainError(f"{period_start:%B %Y} has not ended yet.", field="period")
    # FOR UPDATE waits for metering batches holding the account (FOR NO KEY UPDATE) and keeps
    # new ones out until this month is issued: the draft's records are final while we price.
    account = BillingAccount.objects.select_for_update().get(pk=account_id)
    existing = Invoice.objects.filter(account=account, period_start=period_start).first()
    if existing is not None and existing.status != Invoice.Status.DRAFT:
        return existing
    if meter:
        project_ids = set(
            ProjectBilling.objects.filter(account=account).values_list("project_id", flat=True)
        )
        usage_meter(now=now, project_ids=project_ids)
        storage_meter(now=now, project_ids=project_ids)
    usage_apply_coverage(account_id=account.pk, period_start=period_start)
    invoice = draft_invoice(account.pk, period_start)
    invoice.currency, invoice.tax_rate = account_currency(account), account.tax_rate
    lines = _Lines(invoice)
    charges = _add_reserved_fees(lines, account, start, end)
    _add_usage(lines, invoice, period_start)
    _add_storage(lines, invoice, period_start)
    charges += _add_adjustments(lines, account, invoice)
    if not lines.rows:
        return _nothing_to_bill(invoice, now=now)
    subtotal = lines.total
    credits = _draw_credits(lines, account, invoice, subtotal, charges)
    tax = _add_tax(lines, account, subtotal - credits)
    _carry_negative_balance(lines, account, invoice, now=now)
    _issue(invoice, lines, subtotal=subtotal, credits=credits, tax=tax, now=now)
    return invoice


def _nothing_to_bill(invoice: Invoice, *, now: datetime) -> Invoice:
    """An idle month: no invoice (no $0 mail, no number used); later usage of this month is
    metered onto the next open month as late usage, as for an issued one."""
    invoice.status = Invoice.Status.NOTHING
    invoice.issued_at = now
    invoice.save(update_fields=["status", "issued_at", "currency", "tax_rate"])
    audit_record(
        actor=None,
        action="billing.invoice.nothing_to_bill",
        target=invoice,
        data={"account": invoice.account_id, "period": invoice.period_start.isoformat()},
    )
    return invoice


def _add_reserved_fees(
    lines: _Lines, account: BillingAccount, start: datetime, end: datetime
) -> list[tuple[datetime, Decimal]]:
    """One line per plan month that begins in the month, at the plan's monthly fee (billed
    per plan month, `pricing.plan_fees`). Returns the fees dated at their plan month's start."""
    charges: list[tuple[datetime, Decimal]] = []
    for plan in ReservedPlan.objects.filter(
        account=account, starts_at__lt=end, ends_at__gt=start
    ).select_related("gpu_model"):
        for month_start, fee in pricing.plan_fees(
            starts_at=plan.starts_at,
            ends_at=plan.ends_at,
            monthly_fee=plan.monthly_fee,
            start=start,
            end=end,
        ):
            month_end = min(pricing.add_months(month_start, 1), plan.ends_at)
            lines.add(
                InvoiceLine.Kind.RESERVED_FEE,
                f"Reserved {plan.gpus} × {plan.gpu_model.name}, {plan.term_months}-month term, "
                f"plan month {month_start:%Y-%m-%d} to {month_end:%Y-%m-%d}",
                fee,
                gpu_model=plan.gpu_model,
                plan=plan,
                unit_price=plan.monthly_fee,
            )
            charges.append((month_start, fee))
    return charges


def _add_usage(lines: _Lines, invoice: Invoice, period_start: date) -> None:
    """The usage on the draft, grouped: first what reserved capacity covered (at no charge),
    then what is billed: pay-as-you-go, preemptible, and late usage (of an earlier month,
    metered after that month closed), then the fault credits. A fault credit line offsets one
    usage line: same records grouping, same rounding (the sum of the credited records' amounts
    rounded once to the cent), so fully credited usage nets to exactly 0.00."""
    uncovered = Q(milli_seconds__gt=F("covered_milli_seconds"))
    faulted = Q(fault_credit=True) & Q(amount__gt=0)
    groups = list(
        UsageRecord.objects.filter(invoice=invoice)
        .values("period_start", "gpu_model_id", "gpu_model__name", "tier", "rate")
        .annotate(
            ms=Sum("milli_seconds"),
            covered=Sum("covered_milli_seconds"),
            cost=Sum("amount"),
            n_covered=Count("id", filter=Q(covered_milli_seconds__gt=0)),
            n_billed=Count("id", filter=uncovered),
            fault_cost=Sum("amount", filter=faulted),
            fault_ms=Sum(F("milli_seconds") - F("covered_milli_seconds"), filter=faulted),
            n_fault=Count("id", filter=faulted),
        )
        .order_by("-period_start", "gpu_model__name", "tier", "rate")
    )
    covered: dict[tuple[int, str], list[int]] = {}
    for g in groups:
        if g["covered"] and g["period_start"] == period_start:
            key = (g["gpu_model_id"], g["gpu_model__name"])
            acc = covered.setdefault(key, [0, 0])
            acc[0] += g["covered"]
            acc[1] += g["n_covered"]
    for (model_id, name), (ms, n) in sorted(covered.items(), key=lambda kv: kv[0][1]):
        lines.add(
            InvoiceLine.Kind.COVERED,
            f"{name}: usage covered by reserved capacity",
            Decimal("0.00"),
            gpu_model_id=model_id,
            gpu_hours=pricing.gpu_hours(ms),
            record_count=n,
        )
    credits: list[tuple[Any, str]] = []
    for g in groups:
        billed_ms = g["ms"] - (g["covered"] or 0)
        if billed_ms <= 0:
            continue
        kind, what = _usage_line_kind(
            g["gpu_model__name"],
            g["tier"],
            usage_month=g["period_start"],
            closing_month=period_start,
            beyond_reserved=(g["gpu_model_id"], g["gpu_model__name"]) in covered,
        )
        lines.add(
            kind,
            what,
            pricing.to_cents(g["cost"]),
            gpu_model_id=g["gpu_model_id"],
            tier=g["tier"],
            usage_period_start=g["period_start"],
            gpu_hours=pricing.gpu_hours(billed_ms),
            unit_price=g["rate"],
            record_count=g["n_billed"],
        )
        if g["n_fault"]:
            credits.append((g, what))
    for g, what in credits:
        lines.add(
            InvoiceLine.Kind.FAULT_CREDIT,
            f"Platform fault credit on {what[0].lower()}{what[1:]} (node lost, GPU fault, "
            "preemption without checkpoint)",
            -pricing.to_cents(g["fault_cost"]),
            gpu_model_id=g["gpu_model_id"],
            tier=g["tier"],
            usage_period_start=g["period_start"],
            gpu_hours=pricing.gpu_hours(g["fault_ms"]),
            unit_price=g["rate"],
            record_count=g["n_fault"],
        )


def _add_storage(lines: _Lines, invoice: Invoice, period_start: date) -> None:
    """Storage on the draft: one line per month and rate (GB-months of volumes' size limits;
    a month other than the closing one is storage metered after its close)."""
    for g in storage_line_groups(invoice):
        late = g.period_start != period_start
        lines.add(
            InvoiceLine.Kind.STORAGE,
            f"Storage: {pricing.gb_months(g.gib_seconds)} GB-months of volumes at "
            f"{g.rate} per GB-month"
            + (f", of {g.period_start:%B %Y} metered after its close" if late else ""),
            pricing.to_cents(g.amount),
            usage_period_start=g.period_start,
            unit_price=g.rate,
            record_count=g.records,
        )


def _usage_line_kind(
    model: str, tier: str, *, usage_month: date, closing_month: date, beyond_reserved: bool
) -> tuple[str, str]:
    """The kind and description of a billed usage line: late usage (of an earlier month,
    metered after its close), preemptible, or pay-as-you-go (beyond reserved capacity when
    some of the model's usage was covered)."""
    if usage_month != closing_month:
        return (
            InvoiceLine.Kind.LATE_USAGE,
            f"{model}: {Tier(tier).label.lower()} usage of {usage_month:%B %Y} metered after its close",
        )
    if tier == Tier.PREEMPTIBLE:
        return InvoiceLine.Kind.PREEMPTIBLE, f"{model}: preemptible usage"
    return InvoiceLine.Kind.USAGE, f"{model}: pay-as-you-go usage" + (
        " beyond reserved capacity" if beyond_reserved else ""
    )


def _add_adjustments(
    lines: _Lines, account: BillingAccount, invoice: Invoice
) -> list[tuple[datetime, Decimal]]:
    """The account's adjustments not yet on an invoice go on this one. Returns them dated."""
    adjustments = list(
        Adjustment.objects.select_for_update().filter(account=account, invoice__isnull=True)
    )
    for adj in adjustments:
        lines.add(InvoiceLine.Kind.ADJUSTMENT, adj.description, adj.amount, adjustment=adj)
    Adjustment.objects.filter(pk__in=[a.pk for a in adjustments]).update(invoice=invoice)
    return [(adj.created_at, adj.amount) for adj in adjustments]


def _draw_credits(
    lines: _Lines,
    account: BillingAccount,
    invoice: Invoice,
    subtotal: Decimal,
    charges: list[tuple[datetime, Decimal]],
) -> Decimal:
    """Draw the subtotal down from the account's credit grants, each paying only for charges
    inside its validity (`credit_draws`); returns the amount drawn."""
    draws = credit_draws(account=account, invoice=invoice, due=subtotal, other_charges=charges)
    credits = pricing.sum_amounts(d for _, d in draws)
    if credits:
        lines.add(InvoiceLine.Kind.CREDITS, "Prepaid credits drawn down", -credits)
        CreditApplication.objects.bulk_create(
            [CreditApplication(grant_id=g, invoice=invoice, amount=d) for g, d in draws]
        )
    return credits


def _add_tax(lines: _Lines, account: BillingAccount, taxable: Decimal) -> Decimal:
    """The tax line is always stated, at 0 % too."""
    tax = pricing.tax_on(taxable, account.tax_rate)
    lines.add(
        InvoiceLine.Kind.TAX,
        f"Tax at {account.tax_rate * 100:.2f} %",
        tax,
        unit_price=account.tax_rate,
    )
    return tax


def _carry_negative_balance(
    lines: _Lines, account: BillingAccount, invoice: Invoice, *, now: datetime
) -> None:
    """A negative total is not charged back nor pushed to Stripe (where it would become a
    balance the ledger never sees): a line brings the invoice to 0.00 and the balance goes
    onto the next invoice as a credit adjustment pointing to this one."""
    total = lines.total
    if total >= 0:
        return
    lines.add(InvoiceLine.Kind.CARRIED, "Credit balance carried to the next invoice", -total)
    adjustment = Adjustment.objects.create(
        account=account,
        amount=total,
        description=f"Credit balance carried from invoice of {invoice.period_start:%B %Y}",
        source_invoice=invoice,
        created_at=now,
    )
    audit_record(
        actor=None,
        action="billing.adjustment.carry_credit",
        target=adjustment,
        data={"amount": str(total), "from_invoice": invoice.pk},
    )


def _issue(
    invoice: Invoice,
    lines: _Lines,
    *,
    subtotal: Decimal,
    credits: Decimal,
    tax: Decimal,
    now: datetime,
) -> None:
    """Write the lines and the totals, open the invoice, and after commit mail it and push
    it to Stripe."""
    InvoiceLine.objects.bulk_create(lines.rows)
    invoice.number = invoice_number_next()
    invoice.seller, invoice.buyer = seller_details(), buyer_details(invoice.account)
    invoice.subtotal = subtotal
    invoice.credits_applied = credits
    invoice.tax = tax
    invoice.total = lines.total
    invoice.status = Invoice.Status.OPEN if invoice.total > 0 else Invoice.Status.PAID
    invoice.paid_at = None if invoice.total > 0 else now
    invoice.issued_at = now
    invoice.save()
    audit_record(
        actor=None,
        action="billing.invoice.issue",
        target=invoice,
        data={"number": invoice.number, "total": str(invoice.total), "lines": len(lines.rows)},
    )
    invoice_id = invoice.pk
    transaction.on_commit(lambda: enqueue("billing.send_invoice_email", invoice_id))
    if gateway.enabled() and invoice.total > 0:  # nothing to collect: not sent to Stripe
        transaction.on_commit(lambda: enqueue("billing.push_invoice_to_stripe", invoice_id))


def invoice_number_next() -> str:
    """The issuer's next invoice number (BILLING_ISSUER_ID-000001, …): one sequence, taken
    under a row lock in the issuing transaction, so numbers have no gaps and no repeats."""
    issuer = settings.BILLING_ISSUER_ID
    InvoiceSequence.objects.get_or_create(issuer=issuer)
    seq = InvoiceSequence.objects.select_for_update().get(issuer=issuer)
    seq.last += 1
    seq.save(update_fields=["last"])
    return f"{issuer}-{seq.last:06d}"


def seller_details() -> dict[str, str]:
    """The issuer's legal details, from settings (frozen onto each invoice at issue)."""
    return {
        "name": settings.BILLING_SELLER_NAME,
        "address": settings.BILLING_SELLER_ADDRESS,
        "tax_id": settings.BILLING_SELLER_TAX_ID,
        "email": settings.BILLING_SELLER_EMAIL,
    }


def buyer_details(account: BillingAccount) -> dict[str, str]:
    """The account's legal details (frozen onto each invoice at issue)."""
    return {
        "name": account.legal_name or account.name,
        "address": account.legal_address,
        "tax_id": account.tax_id,
        "email": account.email,
    }


def invoice_pdf(*, invoice: Invoice) -> bytes:
    from billing.documents import render_invoice_pdf

    return render_invoice_pdf(invoice)


def invoices_close_month(
    *, period_start: date | None = None, now: datetime | None = None
) -> list[int]:
    """Accounts still to close for a month (default: the month before `now`)."""
    period_start = period_start or previous_period(now)
    usage_meter(now=now)  # opens an account for every project that used GPUs
    storage_meter(now=now)  # ... or held volumes
    done = (
        Invoice.objects.filter(period_start=period_start)
        .exclude(status=Invoice.Status.DRAFT)
        .values_list("account_id", flat=True)
    )
    return list(
        BillingAccount.objects.exclude(pk__in=done).order_by("pk").values_list("pk", flat=True)
    )
