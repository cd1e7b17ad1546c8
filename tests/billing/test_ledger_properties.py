"""Property tests on invoices and their FOCUS export: whatever the usage, reservations,
faults (learned in time or after the close), credits, adjustments and tax, an invoice is
the sum of its lines, its lines are usage + fees − fault credits + adjustments − credits +
tax to the cent under the stated rounding, and its FOCUS rows sum to it."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing import exports, pricing, selectors, services
from billing.models import Adjustment, Invoice, UsageRecord
from scheduler.models import Allocation, Gpu
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db
T0 = at("2025-03-01 00:00")
MONTHS = (date(2025, 3, 1), date(2025, 4, 1))
BILLED_COST = exports.FOCUS_COLUMNS.index("BilledCost")
EFFECTIVE_COST = exports.FOCUS_COLUMNS.index("EffectiveCost")


@st.composite
def workloads(draw):
    """Back-to-back allocations per H100 over March and April; some end in a fault, some
    learn their fault after March closed (they run across the close)."""
    out = []
    for gpu in range(4):
        cursor = draw(st.integers(0, 10 * 86400))
        for _ in range(draw(st.integers(0, 3))):
            length = draw(st.integers(1, 6 * 86400))
            out.append(
                {
                    "gpu": gpu,
                    "share": draw(st.sampled_from([1000, 1000, 500, 250])),
                    "start": cursor,
                    "end": cursor + length,
                    "reason": draw(st.sampled_from(["completed", "node_lost", "gpu_fault"])),
                    "preemptible": draw(st.booleans()),
                }
            )
            cursor += length + draw(st.integers(0, 86400))
    return out


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    work=workloads(),
    reserved=st.integers(0, 2),
    credit=st.sampled_from([None, Decimal("0.01"), Decimal("7.77"), Decimal("5000.00")]),
    adjustment=st.sampled_from([None, Decimal("-3.33"), Decimal("12.34"), Decimal("-9000.00")]),
    tax_rate=st.sampled_from([Decimal("0"), Decimal("0.19"), Decimal("0.0725")]),
)
def test_invoices_and_focus_add_up(lab, place, work, reserved, credit, adjustment, tax_rate):
    h100 = list(Gpu.objects.filter(model__name="H100-80GB-SXM").order_by("pk"))
    with transaction.atomic():
        account = services.account_open_for_project(project=lab["a"])
        account.tax_rate = tax_rate
        account.save()
        if reserved:
            services.reserved_plan_create(
                actor=None,
                account=account,
                gpu_model=lab["h100"],
                gpus=reserved,
                term_months=1,
                starts_at=at("2025-03-05 12:00"),
            )
        if credit:
            services.credit_grant(actor=None, account=account, amount=credit, granted_at=T0)
        if adjustment:
            Adjustment.objects.create(account=account, amount=adjustment, description="Manual")
        allocs = []
        for w in work:
            alloc = place(
                gpu=h100[w["gpu"]],
                share=w["share"],
                start=T0 + timedelta(seconds=w["start"]),
                end=T0 + timedelta(seconds=w["end"]),
                end_reason=w["reason"],
                preemptible=w["preemptible"],
            )
            allocs.append((alloc, alloc.ended_at, alloc.end_reason))
        # what still runs at March's close is seen running then; its end (maybe a fault)
        # is learned after
        close_march = at("2025-04-01 00:30")
        Allocation.objects.filter(ended_at__gt=close_march).update(ended_at=None, end_reason="")
        services.usage_meter(now=close_march)
        invoices = [
            services.invoice_close(account_id=account.pk, period_start=MONTHS[0], now=close_march)
        ]
        for alloc, ended_at, reason in allocs:
            Allocation.objects.filter(pk=alloc.pk).update(ended_at=ended_at, end_reason=reason)
        invoices.append(
            services.invoice_close(
                account_id=account.pk, period_start=MONTHS[1], now=at("2025-06-01 00:00")
            )
        )
        for invoice in invoices:
            check(Invoice.objects.get(pk=invoice.pk))
        transaction.set_rollback(True)


def check(invoice: Invoice) -> None:
    if invoice.status == Invoice.Status.NOTHING:
        assert not invoice.lines.exists()
        assert not UsageRecord.objects.filter(invoice=invoice).exists()
        return
    lines = list(invoice.lines.all())
    by_kind: dict[str, Decimal] = {}
    for line in lines:
        by_kind[line.kind] = by_kind.get(line.kind, Decimal(0)) + line.amount
        assert line.amount == line.amount.quantize(pricing.CENT)
        if line.kind in ("usage", "preemptible", "late_usage"):
            records = selectors.line_records(line=line)
            assert line.amount == pricing.to_cents(sum(r.amount for r in records))
            assert line.record_count == records.count()
        if line.kind == "fault_credit":
            records = selectors.line_records(line=line)
            assert line.amount == -pricing.to_cents(sum(r.amount for r in records))
            assert line.record_count == records.count()
    assert sum(by_kind.values(), Decimal(0)) == invoice.total
    usage = sum((by_kind.get(k, 0) for k in ("usage", "preemptible", "late_usage")), Decimal(0))
    fees = by_kind.get("reserved_fee", Decimal(0))
    faults = by_kind.get("fault_credit", Decimal(0))
    adjustments = by_kind.get("adjustment", Decimal(0))
    credits = -by_kind.get("credits", Decimal(0))
    assert invoice.subtotal == usage + fees + faults + adjustments
    assert credits == invoice.credits_applied <= max(Decimal(0), invoice.subtotal)
    assert (
        by_kind["tax"]
        == invoice.tax
        == pricing.tax_on(invoice.subtotal - credits, invoice.tax_rate)
    )
    carried = by_kind.get("carried", Decimal(0))
    assert invoice.total == invoice.subtotal - credits + invoice.tax + carried
    assert invoice.total >= 0 and carried >= 0
    # fully credited usage nets to zero, line by line
    usage_lines = {
        (line.usage_period_start, line.gpu_model_id, line.tier, line.unit_price): line.amount
        for line in lines
        if line.kind in ("usage", "preemptible", "late_usage")
    }
    for line in lines:
        if line.kind == "fault_credit":
            key = (line.usage_period_start, line.gpu_model_id, line.tier, line.unit_price)
            assert -line.amount <= usage_lines[key]
    # FOCUS: billed and effective cost over the invoice's period are its total
    rows = list(exports.focus_rows_for_invoice(invoice))
    assert sum((Decimal(r[BILLED_COST]) for r in rows), Decimal(0)) == invoice.total
    assert sum((Decimal(r[EFFECTIVE_COST]) for r in rows), Decimal(0)) == invoice.total
