"""Exports of the usage ledger: plain CSV, and the FinOps FOCUS 1.0 columns."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.conf import settings
from django.db.models import Max, Min, QuerySet, Sum

from billing import pricing
from billing.models import (
    UNISSUED_STATUSES,
    Invoice,
    InvoiceLine,
    ReservedPlan,
    StorageUsageRecord,
    Tier,
    UsageRecord,
)
from billing.pricing import period_bounds
from portal.models import Project

CSV_COLUMNS = [
    "record_id",
    "project",
    "job_id",
    "job_name",
    "allocation_id",
    "gpu_model",
    "tier",
    "slice_start",
    "slice_end",
    "seconds",
    "share_milli",
    "billed_milli",
    "gpu_hours",
    "covered_gpu_hours",
    "rate_per_gpu_hour",
    "gross_amount",
    "amount",
    "fault_credit",
    "invoice",
    # storage rows (kind "storage") leave the GPU columns empty and fill these
    "kind",
    "volume",
    "size_gib",
    "gb_months",
    "rate_per_gb_month",
]

FOCUS_COLUMNS = [
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingCurrency",
    "BillingPeriodStart",
    "BillingPeriodEnd",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodStart",
    "ChargePeriodEnd",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "SkuId",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "Tags",
    "x_InvoiceNumber",
    "x_InvoiceLine",
    "x_Corrects",
    # focus-validator 1.0.0 still reads five pre-1.0 names (ChargeCategory was ChargeType,
    # InvoiceIssuerName InvoiceIssuer, ProviderName Provider, PublisherName Publisher,
    # ResourceId ResourceID); they are copies, so the file passes it and the spec alike.
    "ChargeType",
    "InvoiceIssuer",
    "Provider",
    "Publisher",
    "ResourceID",
]

# GPU-hours in FOCUS rows carry this many decimals: a metered milli-GPU-second is 1/3.6e6
# GPU-hour, so 10 decimals make unit price × quantity equal the cost at the 1e-6 USD the
# ledger prices to (quantities are never rounded to the 4 decimals invoices print).
FOCUS_QUANTITY = Decimal("1e-10")


class _Echo:
    def write(self, value: str) -> str:
        return value


def _iso(moment: Any) -> str:
    return str(moment.strftime("%Y-%m-%dT%H:%M:%SZ"))


# A cell that starts with one of these is a formula to a spreadsheet (CSV injection): a job
# named "=HYPERLINK(...)" must reach finance as text. Such cells get a leading apostrophe,
# except plain numbers ("-0.43"), which stay numbers.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
_PLAIN_NUMBER = re.compile(r"[-+]?[0-9]+(\.[0-9]+)?")


def csv_cell(value: Any) -> Any:
    """`value` safe to open in a spreadsheet: text that would be read as a formula is quoted."""
    if (
        isinstance(value, str)
        and value.startswith(FORMULA_STARTS)
        and not _PLAIN_NUMBER.fullmatch(value)
    ):
        return "'" + value
    return value


def csv_lines(header: list[str], rows: Iterable[list[Any]]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(header)
    for row in rows:
        yield writer.writerow([csv_cell(v) for v in row])


def usage_csv_rows(records: Iterable[UsageRecord]) -> Iterator[list[Any]]:
    for r in records:
        yield [
            r.pk,
            r.project.slug,
            r.job_id,
            r.job.name,
            r.allocation_id,
            r.gpu_model.name,
            r.tier,
            _iso(r.slice_start),
            _iso(r.slice_end),
            r.seconds,
            r.share_milli,
            r.billed_milli,
            pricing.gpu_hours(r.milli_seconds),
            pricing.gpu_hours(r.covered_milli_seconds),
            r.rate,
            r.gross_amount,
            r.amount,
            int(r.fault_credit),
            _invoice_number(r.invoice),
            "gpu",
            "",
            "",
            "",
            "",
        ]


def _invoice_number(invoice: Invoice | None) -> str:
    return invoice.number if invoice is not None and invoice.status not in UNISSUED_STATUSES else ""


def storage_csv_rows(records: Iterable[StorageUsageRecord]) -> Iterator[list[Any]]:
    """Storage records in the CSV's columns: one row per volume slice, kind "storage"."""
    for r in records:
        yield [
            r.pk,
            r.project.slug,
            "",
            "",
            "",
            "",
            "",
            _iso(r.slice_start),
            _iso(r.slice_end),
            int((r.slice_end - r.slice_start).total_seconds()),
            "",
            "",
            "",
            "",
            "",
            r.amount,
            r.amount,
            0,
            _invoice_number(r.invoice),
            "storage",
            r.volume.name,
            r.size_gib,
            pricing.gb_months(r.gib_seconds),
            r.rate,
        ]


def focus_quantity(milli_seconds: int) -> Decimal:
    """GPU-hours of `milli_seconds`, unrounded to within FOCUS_QUANTITY."""
    return (Decimal(milli_seconds) / pricing.MILLI_SECONDS_PER_GPU_HOUR).quantize(
        FOCUS_QUANTITY, ROUND_HALF_UP
    )


@dataclass
class _Commitments:
    """Reserved fees of an invoice spread over the usage they covered: per GPU model, the
    fee per covered milli-GPU-second of reserved capacity; what capacity went unused is one
    "Unused" row per model, so the amortized costs sum to the fees exactly."""

    per_ms: dict[int, Decimal]
    plan_of: dict[int, ReservedPlan]
    fees: dict[int, Decimal]
    amortized: dict[int, Decimal]

    @classmethod
    def of(cls, invoice: Invoice) -> _Commitments:
        start, end = period_bounds(invoice.period_start)
        fees: dict[int, Decimal] = {}
        capacity: dict[int, int] = {}
        plan_of: dict[int, ReservedPlan] = {}
        for line in invoice.lines.filter(kind=InvoiceLine.Kind.RESERVED_FEE).select_related(
            "plan", "plan__gpu_model"
        ):
            plan = line.plan
            if plan is None:
                continue
            model = plan.gpu_model_id
            seconds = int((min(plan.ends_at, end) - max(plan.starts_at, start)).total_seconds())
            fees[model] = fees.get(model, pricing.ZERO) + line.amount
            capacity[model] = capacity.get(model, 0) + plan.gpus * pricing.MILLI * seconds
            plan_of.setdefault(model, plan)
        per_ms = {m: fees[m] / capacity[m] for m in fees if capacity[m] > 0}
        return cls(per_ms, plan_of, fees, dict.fromkeys(fees, pricing.ZERO))

    def share(self, record: UsageRecord) -> Decimal:
        rate = self.per_ms.get(record.gpu_model_id)
        if rate is None or not record.covered_milli_seconds:
            return pricing.ZERO
        amount = (rate * record.covered_milli_seconds).quantize(pricing.RECORD_QUANT, ROUND_HALF_UP)
        self.amortized[record.gpu_model_id] += amount
        return amount


def _commitment_id(plan: ReservedPlan) -> str:
    return f"reserved-plan-{plan.pk}"


def _commitment_price(plan: ReservedPlan) -> str:
    return f"price-{plan.price_version_id}-reserved-{plan.term_months}m"


def _commitment_name(plan: ReservedPlan) -> str:
    return f"Reserved {plan.gpus} × {plan.gpu_model.name}, {plan.term_months}-month term"


def focus_rows_for_invoice(invoice: Invoice) -> Iterator[list[Any]]:
    """The FOCUS rows of an issued invoice, which sum to it: BilledCost over all rows equals
    the invoice total to the cent, EffectiveCost too (reserved fees are billed on their
    Purchase rows and spread, as EffectiveCost, over the usage they covered and an Unused
    row). One row per usage record; per invoice line a row for what is not usage (fees,
    fault credits, adjustments, credits, tax, a carried balance) and, for a usage line, a
    rounding row when its records' exact sum differs from the line's cents."""
    ctx = _FocusContext.of(invoice)
    commitments = _Commitments.of(invoice)
    line_of_group: dict[tuple[Any, ...], InvoiceLine] = {}
    lines = list(
        invoice.lines.select_related("gpu_model", "plan", "plan__gpu_model", "adjustment").order_by(
            "position"
        )
    )
    for line in lines:
        if line.kind in _USAGE_KINDS:
            key = (line.usage_period_start, line.gpu_model_id, line.tier, line.unit_price)
            line_of_group[key] = line
    exact: dict[int, Decimal] = {}
    records = (
        UsageRecord.objects.filter(invoice=invoice)
        .select_related("gpu_model", "job", "project", "price_version")
        .order_by("slice_start", "pk")
    )
    for r in records.iterator(chunk_size=2000):
        of_line = line_of_group.get((r.period_start, r.gpu_model_id, r.tier, r.rate))
        if of_line is not None:
            exact[of_line.pk] = exact.get(of_line.pk, pricing.ZERO) + r.amount
        yield _usage_row(ctx, r, of_line, commitments)
    yield from _storage_rows(
        ctx, StorageUsageRecord.objects.filter(invoice=invoice), _storage_lines(lines), exact
    )
    for model, plan in commitments.plan_of.items():
        unused = commitments.fees[model] - commitments.amortized[model]
        if unused:
            yield ctx.row(
                billed=pricing.ZERO,
                effective=unused,
                category="Usage",
                description=f"{_commitment_name(plan)}: reserved capacity not used",
                frequency="Usage-Based",
                commitment=plan,
                commitment_status="Unused",
                pricing_category="Committed",
                resource=f"reserved-plan/{plan.pk}",
                resource_name=_commitment_name(plan),
                sku=plan.gpu_model.name,
                sku_price=_commitment_price(plan),
            )
    for line in lines:
        yield from _line_rows(ctx, line, exact)


_USAGE_KINDS = frozenset(
    {InvoiceLine.Kind.USAGE, InvoiceLine.Kind.PREEMPTIBLE, InvoiceLine.Kind.LATE_USAGE}
)


@dataclass
class _FocusContext:
    invoice: Invoice
    account_id: str
    account_name: str
    currency: str
    period_start: str
    period_end: str
    provider: str
    issuer: str

    @classmethod
    def of(cls, invoice: Invoice) -> _FocusContext:
        start, end = period_bounds(invoice.period_start)
        return cls(
            invoice=invoice,
            account_id=f"account-{invoice.account_id}",
            account_name=invoice.account.name,
            currency=invoice.currency.upper(),
            period_start=_iso(start),
            period_end=_iso(end),
            provider=settings.BILLING_PROVIDER_NAME,
            issuer=(invoice.seller or {}).get("name") or settings.BILLING_PROVIDER_NAME,
        )

    def row(
        self,
        *,
        billed: Decimal,
        effective: Decimal,
        category: str,
        description: str,
        frequency: str,
        charge_class: str = "",
        charge_start: str | None = None,
        charge_end: str | None = None,
        commitment: ReservedPlan | None = None,
        commitment_status: str = "",
        quantity: Decimal | str = "",
        unit: str = "",
        contracted_cost: Decimal | None = None,
        contracted_price: Decimal | str = "",
        list_cost: Decimal | None = None,
        list_price: Decimal | str = "",
        pricing_category: str = "",
        resource: str = "",
        resource_name: str = "",
        sku: str = "",
        sku_price: str = "",
        project: Project | None = None,
        tags: dict[str, str] | None = None,
        line: InvoiceLine | None = None,
        corrects: str = "",
        service_category: str = "Compute",
        service_name: str = "GPU Compute",
        resource_type: str = "GPU",
    ) -> list[Any]:
        """One FOCUS row: a value for each of FOCUS_COLUMNS, in their order.

        Not cut into steps: the list is one entry per FOCUS column in the column order, read
        side by side with FOCUS_COLUMNS; split in parts, a column's value would no longer sit at
        its column's place."""
        return [
            "",
            billed,
            self.account_id,
            self.account_name,
            self.currency,
            self.period_start,
            self.period_end,
            category,
            charge_class,
            description,
            frequency,
            charge_start or self.period_start,
            charge_end or self.period_end,
            "Usage" if commitment is not None else "",
            _commitment_id(commitment) if commitment is not None else "",
            _commitment_name(commitment) if commitment is not None else "",
            commitment_status,
            "Reservation" if commitment is not None else "",
            quantity,
            unit,
            billed if contracted_cost is None else contracted_cost,
            contracted_price,
            effective,
            self.issuer,
            billed if list_cost is None else list_cost,
            list_price,
            pricing_category,
            quantity,
            unit,
            self.provider,
            self.provider,
            "",
            "",
            resource,
            resource_name,
            resource_type if resource else "",
            service_category,
            service_name,
            sku,
            sku_price,
            project.slug if project is not None else "",
            project.name if project is not None else "",
            json.dumps(tags or {}, sort_keys=True),
            self.invoice.number,
            str(line.position) if line is not None else "",
            corrects,
            category,
            self.issuer,
            self.provider,
            self.provider,
            resource,
        ]


def _usage_row(
    ctx: _FocusContext, r: UsageRecord, line: InvoiceLine | None, commitments: _Commitments
) -> list[Any]:
    quantity = focus_quantity(r.milli_seconds)
    list_price = r.price_version.on_demand_per_gpu_hour
    plan = commitments.plan_of.get(r.gpu_model_id) if r.covered_milli_seconds else None
    if r.covered_milli_seconds:
        category = "Committed"
    elif r.tier == Tier.PREEMPTIBLE:
        category = "Dynamic"
    else:
        category = "Standard"
    return ctx.row(
        billed=r.amount,
        effective=r.amount + commitments.share(r),
        category="Usage",
        description=f"{r.gpu_model.name} {Tier(r.tier).label.lower()} GPU time, job #{r.job_id}",
        frequency="Usage-Based",
        charge_start=_iso(r.slice_start),
        charge_end=_iso(r.slice_end),
        commitment=plan,
        commitment_status="Used" if plan is not None else "",
        quantity=quantity,
        unit="GPU-Hours",
        contracted_cost=pricing.usage_amount(r.milli_seconds, r.rate),
        contracted_price=r.rate,
        list_cost=pricing.usage_amount(r.milli_seconds, list_price),
        list_price=list_price,
        pricing_category=category,
        resource=f"job/{r.job_id}/allocation/{r.allocation_id}",
        resource_name=r.job.name,
        sku=r.gpu_model.name,
        sku_price=f"price-{r.price_version_id}-{r.tier}",
        project=r.project,
        tags={"job_id": str(r.job_id), "tier": r.tier, "record": str(r.pk)},
        line=line,
    )


def _storage_lines(lines: list[InvoiceLine]) -> dict[tuple[Any, Any], InvoiceLine]:
    """The invoice's storage lines by (month, rate): the key its storage records group by."""
    return {
        (line.usage_period_start, line.unit_price): line
        for line in lines
        if line.kind == InvoiceLine.Kind.STORAGE
    }


def _storage_rows(
    ctx: _FocusContext,
    records: QuerySet[StorageUsageRecord],
    line_of: dict[tuple[Any, Any], InvoiceLine],
    exact: dict[int, Decimal],
) -> Iterator[list[Any]]:
    """Storage `records` (an invoice's, or a project's on the open month's draft): one row per
    volume, month, rate and price version (the records' exact sum; a line's rounding row
    comes with the line), as ServiceCategory Storage in GB-months."""
    groups = list(
        records.values(
            "period_start", "rate", "volume_id", "volume__name", "project_id", "price_id"
        )
        .annotate(
            gs=Sum("gib_seconds"),
            cost=Sum("amount"),
            first=Min("slice_start"),
            last=Max("slice_end"),
            size=Max("size_gib"),
        )
        .order_by("period_start", "rate", "volume_id", "price_id")
    )
    projects = Project.objects.in_bulk({g["project_id"] for g in groups})
    for g in groups:
        line = line_of.get((g["period_start"], g["rate"]))
        if line is not None:
            exact[line.pk] = exact.get(line.pk, pricing.ZERO) + g["cost"]
        project = projects.get(g["project_id"])
        quantity = (Decimal(g["gs"]) / pricing.STORAGE_MONTH_SECONDS).quantize(FOCUS_QUANTITY)
        contracted = pricing.storage_amount(g["gs"], g["rate"])
        name = f"{project.slug}/{g['volume__name']}" if project else g["volume__name"]
        yield ctx.row(
            billed=g["cost"],
            effective=g["cost"],
            category="Usage",
            description=f"Storage: volume {name}, {g['size']} GiB size limit",
            frequency="Usage-Based",
            charge_start=_iso(g["first"]),
            charge_end=_iso(g["last"]),
            quantity=quantity,
            unit="GB-Months",
            contracted_cost=contracted,
            contracted_price=g["rate"],
            list_cost=contracted,
            list_price=g["rate"],
            pricing_category="Standard",
            resource=f"volume/{g['volume_id']}",
            resource_name=name,
            sku="storage-gb-month",
            sku_price=f"storage-price-{g['price_id']}",
            project=project,
            tags={"volume_id": str(g["volume_id"])},
            line=line,
            service_category="Storage",
            service_name="Volumes",
            resource_type="Volume",
        )


def _line_rows(
    ctx: _FocusContext, line: InvoiceLine, exact: dict[int, Decimal]
) -> Iterator[list[Any]]:
    """The rows an invoice line adds to its records' rows."""
    kind = InvoiceLine.Kind
    common: dict[str, Any] = {"description": line.description, "line": line}
    if line.kind in _USAGE_KINDS or line.kind == kind.STORAGE:
        rounding = line.amount - exact.get(line.pk, pricing.ZERO)
        if rounding:
            storage = line.kind == kind.STORAGE
            yield ctx.row(
                billed=rounding,
                effective=rounding,
                category="Adjustment",
                frequency="One-Time",
                service_category="Storage" if storage else "Compute",
                service_name="Volumes" if storage else "GPU Compute",
                **{**common, "description": f"Rounding of line {line.position} to the cent"},
            )
    elif line.kind == kind.RESERVED_FEE and line.plan is not None:
        plan = line.plan
        yield ctx.row(
            billed=line.amount,
            effective=pricing.ZERO,  # spread over the covered usage and the Unused row
            category="Purchase",
            frequency="Recurring",
            commitment=plan,
            pricing_category="Committed",
            resource=f"reserved-plan/{plan.pk}",
            resource_name=_commitment_name(plan),
            sku=plan.gpu_model.name,
            sku_price=_commitment_price(plan),
            **common,
        )
    elif line.kind == kind.FAULT_CREDIT:
        # A credit of this month's usage, not a correction of an earlier invoice.
        yield ctx.row(
            billed=line.amount,
            effective=line.amount,
            category="Credit",
            frequency="One-Time",
            **common,
        )
    elif line.kind == kind.CREDITS:
        yield ctx.row(
            billed=line.amount,
            effective=line.amount,
            category="Credit",
            frequency="One-Time",
            **common,
        )
    elif line.kind == kind.TAX:
        yield ctx.row(
            billed=line.amount,
            effective=line.amount,
            category="Tax",
            frequency="One-Time",
            **common,
        )
    elif line.kind in (kind.ADJUSTMENT, kind.CARRIED):
        adj = line.adjustment
        corrects = ""
        if adj is not None and adj.source_invoice_id is not None:
            corrects = f"invoice-{adj.source_invoice_id}"
            if adj.source_allocation_id is not None:
                corrects += f"/allocation-{adj.source_allocation_id}"
        yield ctx.row(
            billed=line.amount,
            effective=line.amount,
            category="Adjustment",
            frequency="One-Time",
            charge_class="Correction" if corrects else "",
            corrects=corrects,
            **common,
        )


def focus_rows_open_month(
    invoice: Invoice,
    records: Iterable[UsageRecord],
    storage: QuerySet[StorageUsageRecord] | None = None,
) -> Iterator[list[Any]]:
    """Usage of a month not yet invoiced (`invoice` is its draft): the GPU records' rows, then
    the `storage` records' rows (ServiceCategory Storage, GB-Months), the same rows the issued
    invoice will carry; fees, credits, tax and rounding come with the invoice at the close."""
    ctx = _FocusContext.of(invoice)
    none = _Commitments({}, {}, {}, {})
    for r in records:
        yield _usage_row(ctx, r, None, none)
    if storage is not None:
        yield from _storage_rows(ctx, storage, {}, {})
