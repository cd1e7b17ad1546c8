"""Pure money arithmetic: property tests, no database."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from hypothesis import given, settings
from hypothesis import strategies as st

from billing import pricing
from scheduler.core.model import device_share_milli

T0 = datetime(2025, 1, 31, 22, 0, tzinfo=UTC)


@given(
    start=st.integers(0, 90 * 86400),
    length=st.integers(1, 20 * 86400),
    cuts=st.lists(st.integers(0, 110 * 86400), max_size=5),
)
def test_slices_tile_the_interval_and_never_cross_an_hour_or_month(start, length, cuts):
    a, b = T0 + timedelta(seconds=start), T0 + timedelta(seconds=start + length)
    slices = pricing.slice_interval(a, b, [T0 + timedelta(seconds=c) for c in cuts])
    assert slices[0][0] == a and slices[-1][1] == b
    assert all(left < right for left, right in slices)
    assert all(s[1] == t[0] for s, t in itertools.pairwise(slices))
    assert sum(int((r - l).total_seconds()) for l, r in slices) == length  # noqa: E741
    for left, right in slices:
        assert pricing.floor_hour(left) == pricing.floor_hour(right - timedelta(seconds=1))
        assert pricing.month_start(left) == pricing.month_start(right - timedelta(seconds=1))


@given(
    rate=st.decimals(min_value=0, max_value=100, places=4),
    parts=st.lists(st.integers(0, 10**9), min_size=1, max_size=30),
)
def test_record_amounts_add_up_within_rounding(rate, parts):
    whole = pricing.usage_amount(sum(parts), rate)
    pieces = sum(pricing.usage_amount(p, rate) for p in parts)
    assert abs(whole - pieces) <= Decimal("0.0000005") * len(parts)
    assert pricing.to_cents(pieces) - pricing.to_cents(whole) <= Decimal("0.01") * (
        1 + len(parts) // 10_000
    )


@st.composite
def coverage_case(draw):
    items = []
    for key in range(draw(st.integers(0, 12))):
        start = draw(st.integers(0, 5000))
        end = start + draw(st.integers(1, 3000))
        items.append(
            pricing.CoverageItem(
                key, start, end, draw(st.integers(1, 1000)), draw(st.integers(0, 1))
            )
        )
    steps = []
    for _ in range(draw(st.integers(0, 3))):
        start = draw(st.integers(0, 6000))
        steps.append(
            pricing.CapacityStep(
                start, start + draw(st.integers(1, 4000)), 1000 * draw(st.integers(1, 3))
            )
        )
    return items, steps


@settings(max_examples=200)
@given(coverage_case())
def test_coverage_never_exceeds_usage_or_reserved_capacity(case):
    items, steps = case
    covered = pricing.allocate_coverage(items, steps)
    for item in items:
        assert 0 <= covered[item.key] <= item.milli * (item.end - item.start)
    # at every second, what is covered fits the capacity: check the total against the bound
    horizon = max([i.end for i in items] + [s.end for s in steps] + [0])
    cap_total = (
        sum(
            min(
                sum(s.milli for s in steps if s.start <= t < s.end),
                sum(i.milli for i in items if i.start <= t < i.end),
            )
            for t in range(0, horizon, 1)
        )
        if horizon <= 9000
        else None
    )
    if cap_total is not None:
        assert sum(covered.values()) == cap_total  # greedy fill covers all it can, no more


def test_covered_first_on_demand_then_preemptible():
    items = [pricing.CoverageItem(1, 0, 10, 1000, 1), pricing.CoverageItem(2, 0, 10, 1000, 0)]
    covered = pricing.allocate_coverage(items, [pricing.CapacityStep(0, 10, 1000)])
    assert covered == {1: 0, 2: 10_000}


def test_reserved_fee_proration_credits_and_tax():
    fee = pricing.reserved_monthly_fee(on_demand=Decimal("3.5000"), gpus=2, discount=Decimal("0.3"))
    assert fee == Decimal("3577.00")  # 2 × 730 h × 2.45
    assert pricing.prorate(fee, part_seconds=15 * 86400, whole_seconds=30 * 86400) == Decimal(
        "1788.50"
    )
    assert pricing.apply_credits([(1, Decimal("10")), (2, Decimal("50"))], Decimal("25.50")) == [
        (1, Decimal("10")),
        (2, Decimal("15.50")),
    ]
    assert pricing.apply_credits([(1, Decimal("10"))], Decimal("-3")) == []
    assert pricing.tax_on(Decimal("100.05"), Decimal("0.19")) == Decimal("19.01")
    assert device_share_milli(share_milli=333, capacity_milli=2000) == 166
    assert pricing.crossed_thresholds(spent=Decimal("80"), budget=Decimal("100")) == [50, 80]
    assert pricing.add_months(datetime(2025, 1, 31, tzinfo=UTC), 1) == datetime(
        2025, 2, 28, tzinfo=UTC
    )
    assert pricing.forecast_month(
        to_date=Decimal("10"), elapsed_seconds=86400, month_seconds=30 * 86400
    ) == Decimal("300.00")
