"""Pure money arithmetic: rates, slices, reserved coverage, credits, tax, forecasts.

No Django here and no floats: amounts are `Decimal`, usage is integer seconds × milli-GPU.

Rounding rules (stated once, used everywhere):
- a rate per GPU-hour has 4 decimal places (ROUND_HALF_UP when derived by a discount);
- a usage record's amount is exact to 1e-6 USD (ROUND_HALF_UP);
- an invoice line is the sum of its records' amounts rounded once to the cent (ROUND_HALF_UP);
- tax is computed on the invoice's taxable amount and rounded to the cent (ROUND_HALF_UP);
- the invoice total is the exact sum of its lines.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Final

# The calendar periods are the scheduler core's (quotas count in the same months); billing's
# code reads them through this module.
from scheduler.core.periods import floor_hour as floor_hour
from scheduler.core.periods import month_start as month_start
from scheduler.core.periods import next_month as next_month

MILLI: Final = 1000
SECONDS_PER_HOUR: Final = 3600
MILLI_SECONDS_PER_GPU_HOUR: Final = MILLI * SECONDS_PER_HOUR
HOURS_PER_MONTH: Final = Decimal(730)  # 8760 h / 12: the month a reserved fee is quoted for
# A GB-month of storage: a GiB of a volume's size limit held for 730 hours (whatever the
# calendar month's length, so an hour of storage costs the same in February and in March).
STORAGE_MONTH_SECONDS: Final = 730 * SECONDS_PER_HOUR

RATE_QUANT: Final = Decimal("0.0001")
RECORD_QUANT: Final = Decimal("0.000001")
CENT: Final = Decimal("0.01")
HOURS_QUANT: Final = Decimal("0.0001")
ZERO: Final = Decimal(0)
ONE: Final = Decimal(1)

TIER_ON_DEMAND: Final = "on_demand"
TIER_PREEMPTIBLE: Final = "preemptible"

BUDGET_THRESHOLDS: Final = (50, 80, 100)
GPU_FAULT: Final = "gpu_fault"
FAULT_END_REASONS: Final = frozenset({"node_lost", GPU_FAULT})
RESERVED_TERMS_MONTHS: Final = (1, 12, 36)


def to_cents(amount: Decimal) -> Decimal:
    return amount.quantize(CENT, ROUND_HALF_UP)


def gpu_hours(milli_seconds: int) -> Decimal:
    """GPU-hours for display (4 decimal places); billing never uses the rounded value."""
    return (Decimal(milli_seconds) / MILLI_SECONDS_PER_GPU_HOUR).quantize(
        HOURS_QUANT, ROUND_HALF_UP
    )


def discounted(rate: Decimal, discount: Decimal) -> Decimal:
    """`rate` less a fractional `discount` (0.6 = 60 % off), to 4 decimal places."""
    if not ZERO <= discount <= ONE:
        raise ValueError(f"A discount is a fraction between 0 and 1, not {discount}.")
    return (rate * (ONE - discount)).quantize(RATE_QUANT, ROUND_HALF_UP)


def effective_rate(
    *, on_demand: Decimal, preemptible: bool, preemptible_discount: Decimal
) -> Decimal:
    """The rate per GPU-hour a slice pays: the list price, or the preemptible price."""
    if preemptible:
        return discounted(on_demand, preemptible_discount)
    return on_demand.quantize(RATE_QUANT, ROUND_HALF_UP)


def usage_amount(milli_seconds: int, rate: Decimal) -> Decimal:
    """Price of `milli_seconds` (seconds × milli-GPU) at `rate` per GPU-hour, to 1e-6."""
    if milli_seconds < 0:
        raise ValueError("Usage cannot be negative.")
    return (Decimal(milli_seconds) * rate / MILLI_SECONDS_PER_GPU_HOUR).quantize(
        RECORD_QUANT, ROUND_HALF_UP
    )


def reserved_monthly_fee(*, on_demand: Decimal, gpus: int, discount: Decimal) -> Decimal:
    """Monthly fee of a reservation: GPUs × 730 h × discounted rate, to the cent."""
    if gpus < 1:
        raise ValueError("A reservation holds at least one GPU.")
    return to_cents(Decimal(gpus) * HOURS_PER_MONTH * discounted(on_demand, discount))


def prorate(amount: Decimal, *, part_seconds: int, whole_seconds: int) -> Decimal:
    """`amount` for `part_seconds` of a `whole_seconds` period, to the cent."""
    if whole_seconds <= 0 or not 0 <= part_seconds <= whole_seconds:
        raise ValueError("The part must lie within a non-empty whole.")
    return to_cents(amount * part_seconds / whole_seconds)


def storage_amount(gib_seconds: int, rate_per_gib_month: Decimal) -> Decimal:
    """Price of `gib_seconds` (GiB of size limit × seconds) at a rate per GB-month, to 1e-6."""
    if gib_seconds < 0:
        raise ValueError("Usage cannot be negative.")
    return (Decimal(gib_seconds) * rate_per_gib_month / STORAGE_MONTH_SECONDS).quantize(
        RECORD_QUANT, ROUND_HALF_UP
    )


def gb_months(gib_seconds: int) -> Decimal:
    """GB-months for display (4 decimal places); billing never uses the rounded value."""
    return (Decimal(gib_seconds) / STORAGE_MONTH_SECONDS).quantize(HOURS_QUANT, ROUND_HALF_UP)


# ---- time ---------------------------------------------------------------------------------


def floor_second(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)


def month_bounds(moment: datetime) -> tuple[datetime, datetime]:
    """[start, end) of the UTC calendar month holding `moment`."""
    start = month_start(moment)
    return start, next_month(start)


def period_of(moment: datetime) -> date:
    """The billing period (its first day) that holds `moment`."""
    return month_start(moment).date()


def period_bounds(period_start: date) -> tuple[datetime, datetime]:
    """[start, end) of the billing period that begins on `period_start`."""
    start = datetime(period_start.year, period_start.month, 1, tzinfo=UTC)
    return start, next_month(start)


def add_months(moment: datetime, months: int) -> datetime:
    """`moment` plus whole calendar months, the day clipped to the target month's length."""
    index = moment.month - 1 + months
    year, month = moment.year + index // 12, index % 12 + 1
    last_day = (next_month(datetime(year, month, 1, tzinfo=UTC)) - timedelta(days=1)).day
    return moment.replace(year=year, month=month, day=min(moment.day, last_day))


def plan_months(starts_at: datetime, ends_at: datetime) -> list[tuple[datetime, datetime]]:
    """A reserved plan's months: [start + k months, start + k + 1 months), the last one cut at
    `ends_at`. A plan is billed per plan month, not per calendar month."""
    out: list[tuple[datetime, datetime]] = []
    k = 0
    while True:
        left = add_months(starts_at, k)
        if left >= ends_at:
            return out
        out.append((left, min(add_months(starts_at, k + 1), ends_at)))
        k += 1


def plan_fees(
    *, starts_at: datetime, ends_at: datetime, monthly_fee: Decimal, start: datetime, end: datetime
) -> list[tuple[datetime, Decimal]]:
    """The fees a plan charges on the invoice of [start, end): its full monthly fee for each
    plan month that begins in it, dated at that beginning (a plan month cut short by the
    plan's end is prorated by the second). Whatever day a plan starts, a plan month costs its
    fee: no calendar-month proration."""
    out: list[tuple[datetime, Decimal]] = []
    for left, right in plan_months(starts_at, ends_at):
        if not start <= left < end:
            continue
        whole = int((add_months(left, 1) - left).total_seconds())
        part = int((right - left).total_seconds())
        fee = (
            monthly_fee
            if part >= whole
            else prorate(monthly_fee, part_seconds=part, whole_seconds=whole)
        )
        out.append((left, fee))
    return out


def draw_credits(
    grants: Sequence[tuple[int, Decimal, datetime, datetime | None]],
    charges: Sequence[tuple[datetime, Decimal]],
    cap: Decimal,
) -> list[tuple[int, Decimal]]:
    """Draw credit grants (id, remaining, valid from, valid until or None) against dated
    charges (moment, amount): a grant pays only for charges inside its validity
    [from, until). Grants draw in the given order (soonest to expire first), each from the
    earliest charges it may pay that are still unpaid; all draws together never exceed `cap`
    (what is due before credits). Amounts are cents; returns (id, drawn) > 0."""
    moments = [moment for moment, _ in sorted(charges, key=lambda c: c[0])]
    unpaid_of = [amount for _, amount in sorted(charges, key=lambda c: c[0])]
    budget = max(ZERO, cap)
    out: list[tuple[int, Decimal]] = []
    for grant_id, remaining, valid_from, valid_until in grants:
        take_total = ZERO
        for i, moment in enumerate(moments):
            if budget <= 0 or remaining <= 0:
                break
            unpaid = unpaid_of[i]
            if unpaid <= 0 or moment < valid_from:
                continue
            if valid_until is not None and moment >= valid_until:
                break
            take = min(unpaid, remaining, budget)
            unpaid_of[i] = unpaid - take
            remaining -= take
            budget -= take
            take_total += take
        if take_total > 0:
            out.append((grant_id, take_total))
    return out


def slice_interval(
    start: datetime, end: datetime, cuts: Iterable[datetime] = ()
) -> list[tuple[datetime, datetime]]:
    """Split [start, end) at every hour boundary (so at every month boundary too) and at each
    of `cuts` that falls inside. Slices depend only on the interval and the cuts, so metering
    the same allocation twice yields the same slices."""
    if end <= start:
        return []
    points = {p for p in cuts if start < p < end}
    hour = floor_hour(start) + timedelta(hours=1)
    while hour < end:
        points.add(hour)
        hour += timedelta(hours=1)
    edges = [start, *sorted(points), end]
    return list(itertools.pairwise(edges))


def forecast_month(*, to_date: Decimal, elapsed_seconds: int, month_seconds: int) -> Decimal:
    """Linear run-rate forecast for the whole month, to the cent."""
    if elapsed_seconds <= 0:
        return to_cents(to_date)
    elapsed = min(elapsed_seconds, month_seconds)
    return to_cents(to_date * month_seconds / elapsed)


def crossed_thresholds(
    *, spent: Decimal, budget: Decimal, thresholds: Sequence[int] | None = None
) -> list[int]:
    """Which of the thresholds (% of `budget`; default 50/80/100) the spend has reached."""
    if budget <= 0:
        return []
    return [t for t in (thresholds or BUDGET_THRESHOLDS) if spent * 100 >= budget * t]


def default_budget_thresholds() -> list[int]:
    return list(BUDGET_THRESHOLDS)


def parse_budget_thresholds(text: str) -> list[int]:
    """'50, 80, 100' as sorted whole percentages from 1 to 100, at most five; ValueError
    says what is wrong."""
    parts = [p.strip().rstrip("%").strip() for p in text.replace(";", ",").split(",")]
    values = []
    for part in filter(None, parts):
        if not part.isdigit() or not 1 <= int(part) <= 100:
            raise ValueError(f"{part!r} is not a whole percentage from 1 to 100")
        values.append(int(part))
    values = sorted(set(values))
    if not values or len(values) > 5:
        raise ValueError("give one to five percentages, e.g. 50, 80, 100")
    return values


def fault_credited(
    *, end_reason: str, preemptible: bool, has_checkpoint: bool, corroborated: bool = False
) -> bool:
    """The stated policy: time lost to the platform is not billed. An allocation that ended
    because its node was lost is credited in full; one that ended because its GPU failed, once
    the fault is `corroborated` (a later heartbeat still found the GPU unhealthy, or an
    operator confirmed it: a node's own report alone credits nothing); so is one preempted
    from a job that had no checkpoint directory (its work is lost) unless the job chose
    preemptible."""
    if end_reason == GPU_FAULT:
        return corroborated
    if end_reason in FAULT_END_REASONS:
        return True
    return end_reason == "preempted" and not has_checkpoint and not preemptible


def tax_on(taxable: Decimal, rate: Decimal) -> Decimal:
    if taxable <= 0 or rate <= 0:
        return ZERO.quantize(CENT)
    return to_cents(taxable * rate)


def apply_credits(grants: Sequence[tuple[int, Decimal]], due: Decimal) -> list[tuple[int, Decimal]]:
    """Draw `due` from `grants` (id, remaining) in the given order; returns (id, drawn) > 0."""
    out: list[tuple[int, Decimal]] = []
    left = max(ZERO, due)
    for grant_id, remaining in grants:
        if left <= 0:
            break
        take = min(left, remaining)
        if take > 0:
            out.append((grant_id, take))
            left -= take
    return out


# ---- reserved coverage ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CoverageItem:
    """One usage record on the sweep: [start, end) in epoch seconds at `milli` billed GPU."""

    key: int
    start: int
    end: int
    milli: int
    priority: int = 0  # lower is covered first (on-demand before preemptible)


@dataclass(frozen=True, slots=True)
class CapacityStep:
    """Reserved milli-GPU available over [start, end) in epoch seconds."""

    start: int
    end: int
    milli: int


def allocate_coverage(
    items: Sequence[CoverageItem], capacity: Sequence[CapacityStep]
) -> dict[int, int]:
    """Covered milli-seconds per item key. At every second the covered shares sum to at most
    the reserved capacity; they fill in (priority, start, key) order, whole shares first."""
    covered: dict[int, int] = {item.key: 0 for item in items}
    if not items or not capacity:
        return covered
    edges = sorted(
        {i.start for i in items}
        | {i.end for i in items}
        | {c.start for c in capacity}
        | {c.end for c in capacity}
    )
    order = sorted(items, key=lambda i: (i.priority, i.start, i.key))
    starts: dict[int, list[CoverageItem]] = {}
    for item in order:
        starts.setdefault(item.start, []).append(item)
    active: list[CoverageItem] = []
    for left, right in itertools.pairwise(edges):
        active = [i for i in active if i.end > left]
        if left in starts:
            active = sorted([*active, *starts[left]], key=lambda i: (i.priority, i.start, i.key))
        cap = sum(c.milli for c in capacity if c.start <= left < c.end)
        if cap <= 0 or not active:
            continue
        width = right - left
        for item in active:
            if cap <= 0:
                break
            take = min(cap, item.milli)
            covered[item.key] += take * width
            cap -= take
    return covered


def rate_table_lookup(versions: Sequence[tuple[datetime, int]], moment: datetime) -> int | None:
    """The id of the version in effect at `moment`, from (effective_from, id) sorted ascending."""
    found: int | None = None
    for effective_from, version_id in versions:
        if effective_from <= moment:
            found = version_id
        else:
            break
    return found


def sum_amounts(amounts: Iterable[Decimal]) -> Decimal:
    total = ZERO
    for amount in amounts:
        total += amount
    return total
