"""Property tests on the ledger: whatever the allocations, prices and reservations, usage
records tile each allocation exactly, never bill more than one GPU-hour per GPU per hour,
coverage stays within the reservation, and invoices are exactly the sum of their lines."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing import pricing, selectors, services
from billing.models import Invoice, UsageRecord
from scheduler.core.model import MIN_BILLED_MILLI
from scheduler.models import Gpu
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db
T0 = at("2025-02-27 00:00")
END_REASONS = ["completed", "cancelled", "preempted", "node_lost", "gpu_fault", "failed"]


@st.composite
def lanes(draw):
    """Per GPU index (0, 1: H100 exclusive; 2: L4 time-sliced ×2), lanes of back-to-back
    allocations whose shares sum within the GPU's capacity."""
    out = []
    for gpu_index, capacity in ((0, 1000), (1, 1000), (2, 2000)):
        left = capacity
        for _ in range(draw(st.integers(0, 2))):
            if left <= 0:
                break
            share = draw(st.integers(1, left))
            left -= share
            cursor = draw(st.integers(0, 20 * 86400))
            for _ in range(draw(st.integers(1, 3))):
                length = draw(st.integers(1, 9 * 86400))
                out.append(
                    {
                        "gpu": gpu_index,
                        "share": share,
                        "start": cursor,
                        "end": cursor + length,
                        "reason": draw(st.sampled_from(END_REASONS)),
                        "preemptible": draw(st.booleans()),
                        "checkpoint": draw(st.sampled_from(["", "/ckpt"])),
                    }
                )
                cursor += length + draw(st.integers(0, 86400))
    return out


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    plan=lanes(),
    price_change=st.one_of(st.none(), st.integers(1, 30 * 86400)),
    reserved=st.integers(0, 2),
    micro=st.integers(0, 999_999),
)
def test_ledger_and_invoice_invariants(lab, place, plan, price_change, reserved, micro):
    gpus = [
        *list(Gpu.objects.filter(model__name="H100-80GB-SXM").order_by("pk")[:2]),
        Gpu.objects.filter(model__name="L4").order_by("pk").first(),
    ]
    with transaction.atomic():
        services.price_list_seed()
        if price_change is not None:
            services.price_publish(
                actor=None,
                gpu_model=lab["h100"],
                effective_from=T0 + timedelta(seconds=price_change),
                on_demand_per_gpu_hour=Decimal("1.2345"),
                now=T0,
            )
        account = services.account_open_for_project(project=lab["a"])
        if reserved:
            services.reserved_plan_create(
                actor=None,
                account=account,
                gpu_model=lab["h100"],
                gpus=reserved,
                term_months=1,
                starts_at=at("2025-03-05 12:00"),
            )
        allocs = [
            place(
                gpu=gpus[p["gpu"]],
                share=p["share"],
                start=T0 + timedelta(seconds=p["start"], microseconds=micro),
                end=T0 + timedelta(seconds=p["end"], microseconds=micro),
                end_reason=p["reason"],
                preemptible=p["preemptible"],
                checkpoint=p["checkpoint"],
            )
            for p in plan
        ]
        now = at("2025-04-01 00:10")
        services.usage_meter(now=at("2025-03-20 07:30"))  # a mid-month run, then the close
        invoice = services.invoice_close(
            account_id=account.pk, period_start=date(2025, 3, 1), now=now
        )
        services.usage_meter(now=now)
        check_ledger(allocs, gpus, reserved, now=now)
        check_invoice(invoice)
        transaction.set_rollback(True)


def check_ledger(allocs, gpus, reserved, *, now):
    records = list(UsageRecord.objects.all())
    by_alloc = defaultdict(int)
    per_gpu_hour = defaultdict(int)
    covered_hour = defaultdict(int)
    alloc_gpu = {a.pk: a.gpu_id for a in allocs}
    for r in records:
        by_alloc[r.allocation_id] += r.seconds
        hour = pricing.floor_hour(r.slice_start)
        assert pricing.floor_hour(r.slice_end - timedelta(microseconds=1)) == hour
        per_gpu_hour[(alloc_gpu[r.allocation_id], hour)] += r.milli_seconds
        covered_hour[hour] += r.covered_milli_seconds
        assert 0 <= r.covered_milli_seconds <= r.milli_seconds
        assert r.amount == pricing.usage_amount(r.milli_seconds - r.covered_milli_seconds, r.rate)
    for a in allocs:
        # one that ends after the last meter's `now` is still running then: metered to the
        # last whole hour, the open hour left to readers' estimates
        end = a.ended_at if a.ended_at <= now else pricing.floor_hour(now)
        start = pricing.floor_second(a.started_at)
        expected = max(0, int((pricing.floor_second(end) - start).total_seconds()))
        assert by_alloc.get(a.pk, 0) == expected
    # a share bills at least MIN_BILLED_MILLI: the shares of one device bill one GPU-hour per
    # hour at most, plus that minimum for each of them (at most two lanes of shares per GPU)
    floor = 2 * MIN_BILLED_MILLI * pricing.SECONDS_PER_HOUR
    assert max(per_gpu_hour.values(), default=0) <= pricing.MILLI_SECONDS_PER_GPU_HOUR + floor
    assert max(covered_hour.values(), default=0) <= reserved * pricing.MILLI_SECONDS_PER_GPU_HOUR


def check_invoice(invoice: Invoice):
    lines = list(invoice.lines.all())
    assert sum((line.amount for line in lines), Decimal(0)) == invoice.total
    assert invoice.total == invoice.subtotal - invoice.credits_applied + invoice.tax
    for line in lines:
        if line.kind in ("usage", "preemptible", "late_usage"):
            rows = selectors.line_records(line=line)
            assert line.amount == pricing.to_cents(sum(r.amount for r in rows))
            assert line.record_count == rows.count()
        if line.kind == "fault_credit":
            rows = selectors.line_records(line=line)
            assert line.amount == -pricing.to_cents(sum(r.amount for r in rows))
    on_invoice = UsageRecord.objects.filter(invoice=invoice)
    assert not on_invoice.filter(period_start__gt=invoice.period_start).exists()
    assert not UsageRecord.objects.filter(
        invoice__status="draft", period_start=invoice.period_start
    ).exists()
    usage_lines = [line for line in lines if line.kind in ("usage", "preemptible", "late_usage")]
    billed = sum((r.amount for r in on_invoice), Decimal(0))
    assert abs(sum((line.amount for line in usage_lines), Decimal(0)) - billed) <= Decimal(
        "0.005"
    ) * max(1, len(usage_lines))
