"""Exports of the usage ledger: plain CSV, and the FinOps FOCUS 1.0 columns."""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Iterable, Iterator
from datetime import date
from typing import Any

from django.conf import settings

from billing import pricing
from billing.models import Tier, UsageRecord
from billing.pricing import period_bounds

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
]

FOCUS_COLUMNS = [
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
    "CommitmentDiscountId",
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
]


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
            r.invoice.number if r.invoice is not None and r.invoice.status != "draft" else "",
        ]


def focus_rows(records: Iterable[UsageRecord], *, period_start: date) -> Iterator[list[Any]]:
    """One FOCUS row per usage record (ChargeCategory "Usage"); costs are the record's own."""
    start, end = period_bounds(period_start)
    provider = settings.BILLING_PROVIDER_NAME
    for r in records:
        hours = pricing.gpu_hours(r.milli_seconds)
        list_price = r.price_version.on_demand_per_gpu_hour
        effective = pricing.ZERO if r.fault_credit else r.amount
        if r.covered_milli_seconds:
            category = "Committed"
        elif r.tier == Tier.PREEMPTIBLE:
            category = "Dynamic"
        else:
            category = "Standard"
        yield [
            effective,
            r.account_id,
            r.account.name,
            "USD",
            _iso(start),
            _iso(end),
            "Usage",
            "Correction" if r.fault_credit else "",
            f"{r.gpu_model.name} {Tier(r.tier).label.lower()} GPU time, job #{r.job_id}",
            "Usage-Based",
            _iso(r.slice_start),
            _iso(r.slice_end),
            f"reserved:{r.account_id}:{r.gpu_model.name}" if r.covered_milli_seconds else "",
            hours,
            "GPU-Hours",
            pricing.usage_amount(r.milli_seconds, r.rate),
            r.rate,
            effective,
            provider,
            pricing.usage_amount(r.milli_seconds, list_price),
            list_price,
            category,
            hours,
            "GPU-Hours",
            provider,
            provider,
            "",
            "",
            f"job/{r.job_id}/allocation/{r.allocation_id}",
            r.job.name,
            "GPU",
            "Compute",
            "GPU Compute",
            r.gpu_model.name,
            str(r.price_version_id),
            r.project.slug,
            r.project.name,
            json.dumps({"job_id": str(r.job_id), "tier": r.tier}),
        ]
