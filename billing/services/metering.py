"""Metering: allocations become usage records on the month's draft invoice, platform faults are credited."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing import pricing
from billing.models import (
    AllocationMeter,
    BillingAccount,
    Invoice,
    ReservedPlan,
    Tier,
    UsageRecord,
)
from billing.pricing import period_bounds, period_of
from billing.rates import PriceTable
from billing.selectors import stopped_by_budget_cap
from billing.services.accounts import accounts_for_projects
from billing.services.corrections import usage_fault_credit
from billing.services.coverage import usage_apply_coverage
from billing.services.drafts import draft_invoice
from billing.services.prices import price_list_seed
from portal.errors import DomainError
from scheduler.models import Allocation


@dataclass(frozen=True)
class MeterResult:
    allocations: int
    records: int
    credited: int


def usage_meter(
    *,
    now: datetime | None = None,
    allocation_ids: list[int] | None = None,
    project_ids: set[int] | None = None,
    chunk: int = 500,
) -> MeterResult:
    """Meter allocations into usage records, per second, sliced at the allocation end, every
    hour (so every month boundary) and every price change. Running allocations are metered to
    the last whole hour; the open hour is estimated on the fly by readers. Idempotent: slices
    are deterministic and unique per (allocation, slice start)."""
    now = now or timezone.now()
    horizon = pricing.floor_hour(now)
    price_list_seed()
    table = PriceTable.load()
    qs = (
        Allocation.objects.filter(started_at__lt=now)
        .filter(
            Q(meter__isnull=True)
            | Q(meter__done=False)
            # metered before its GPU fault was corroborated: credited now
            | Q(
                meter__fault_credited=False,
                end_reason=pricing.GPU_FAULT,
                fault_corroborated_at__isnull=False,
            )
        )
        .select_related("job", "gpu", "meter")
        .order_by("pk")
    )
    if allocation_ids is not None:
        qs = qs.filter(pk__in=allocation_ids)
    if project_ids is not None:
        qs = qs.filter(job__project_id__in=project_ids)
    total = MeterResult(0, 0, 0)
    last_pk = 0
    touched: set[tuple[int, date]] = set()
    while True:
        batch = list(qs.filter(pk__gt=last_pk)[:chunk])
        if not batch:
            break
        last_pk = batch[-1].pk
        result = _meter_batch(batch, table=table, horizon=horizon, now=now, touched=touched)
        total = MeterResult(
            total.allocations + result.allocations,
            total.records + result.records,
            total.credited + result.credited,
        )
    reserved_accounts = set(
        ReservedPlan.objects.filter(account_id__in={a for a, _ in touched}).values_list(
            "account_id", flat=True
        )
    )
    for account_id, period in sorted(touched):
        if account_id in reserved_accounts:
            usage_apply_coverage(account_id=account_id, period_start=period)
    return total


@transaction.atomic
def _meter_batch(
    batch: list[Allocation],
    *,
    table: PriceTable,
    horizon: datetime,
    now: datetime,
    touched: set[tuple[int, date]],
) -> MeterResult:
    accounts = accounts_for_projects({a.job.project_id for a in batch})
    records: list[UsageRecord] = []
    meters: list[AllocationMeter] = []
    faults: list[Allocation] = []
    for alloc in batch:
        start = pricing.floor_second(alloc.started_at)
        existing: AllocationMeter | None = getattr(alloc, "meter", None)
        if alloc.ended_at is not None and alloc.ended_at <= now:
            end, done = max(start, pricing.floor_second(alloc.ended_at)), True
        else:
            end, done = max(start, horizon), False
        begin = max(start, existing.metered_until) if existing is not None else start
        tier = Tier.PREEMPTIBLE if (alloc.job.preemptible or alloc.borrowed) else Tier.ON_DEMAND
        billed = alloc.billed_share()  # frozen at placement
        account_id = accounts[alloc.job.project_id]
        cuts = table.changes_within(alloc.gpu_model_id, begin, end)
        for left, right in pricing.slice_interval(begin, end, cuts):
            version = table.at(alloc.gpu_model_id, left)
            if version is None:  # unreachable after price_list_seed; never bill a guess
                raise DomainError(f"No price for GPU model {alloc.gpu_model_id} at {left}.")
            rate = version.rate(preemptible=tier == Tier.PREEMPTIBLE)
            seconds = int((right - left).total_seconds())
            milli_seconds = seconds * billed
            gross = pricing.usage_amount(milli_seconds, rate)
            period = period_of(left)
            touched.add((account_id, period))
            records.append(
                UsageRecord(
                    allocation_id=alloc.pk,
                    job_id=alloc.job_id,
                    project_id=alloc.job.project_id,
                    account_id=account_id,
                    gpu_model_id=alloc.gpu_model_id,
                    price_version_id=version.pk,
                    period_start=period,
                    slice_start=left,
                    slice_end=right,
                    seconds=seconds,
                    share_milli=alloc.share_milli,
                    billed_milli=billed,
                    milli_seconds=milli_seconds,
                    tier=tier,
                    rate=rate,
                    gross_amount=gross,
                    amount=gross,
                )
            )
        credited = done and pricing.fault_credited(
            end_reason=alloc.end_reason,
            preemptible=tier == Tier.PREEMPTIBLE,
            has_checkpoint=bool(alloc.job.checkpoint_dir),
            corroborated=alloc.fault_corroborated_at is not None,
        )
        if credited and alloc.end_reason == Allocation.EndReason.PREEMPTED:
            credited = not stopped_by_budget_cap(alloc)  # the customer's cap, not a fault
        if credited and not (existing is not None and existing.fault_credited):
            faults.append(alloc)
        meters.append(
            AllocationMeter(
                allocation_id=alloc.pk,
                metered_until=max(begin, end),
                done=done,
                fault_credited=credited,
            )
        )
    pages = _open_pages({(r.account_id, r.period_start) for r in records})
    for record in records:
        record.invoice_id = pages[(record.account_id, record.period_start)]
    UsageRecord.objects.bulk_create(records, ignore_conflicts=True, batch_size=2000)
    AllocationMeter.objects.bulk_create(
        meters,
        update_conflicts=True,
        unique_fields=["allocation"],
        update_fields=["metered_until", "done", "fault_credited"],
    )
    for alloc in faults:
        usage_fault_credit(alloc=alloc, account_id=accounts[alloc.job.project_id])
        # its months' coverage is worked out again: credited usage uses up no reservation
        account_id = accounts[alloc.job.project_id]
        touched.update(
            (account_id, period)
            for period in UsageRecord.objects.filter(
                allocation=alloc, invoice__status=Invoice.Status.DRAFT
            )
            .values_list("period_start", flat=True)
            .distinct()
        )
    return MeterResult(len(batch), len(records), len(faults))


def _open_pages(pairs: set[tuple[int, date]]) -> dict[tuple[int, date], int]:
    """(account, month) → the draft invoice a new record is written onto: the month's own, or,
    when that month is already closed, the next open month's (the record is then late usage).
    Locks the accounts (FOR NO KEY UPDATE) so that a close, which takes FOR UPDATE, sees either
    none or all of a metering batch."""
    if not pairs:
        return {}
    account_ids = sorted({a for a, _ in pairs})
    list(
        BillingAccount.objects.select_for_update(no_key=True)
        .filter(pk__in=account_ids)
        .order_by("pk")
        .values_list("pk", flat=True)
    )
    drafts: dict[tuple[int, date], int] = {}
    last_closed: dict[int, date] = {}
    for account_id, period, status, pk in Invoice.objects.filter(
        account_id__in=account_ids
    ).values_list("account_id", "period_start", "status", "pk"):
        if status == Invoice.Status.DRAFT:
            drafts[(account_id, period)] = pk
        elif period > last_closed.get(account_id, date.min):
            last_closed[account_id] = period
    out: dict[tuple[int, date], int] = {}
    for account_id, period in sorted(pairs):
        target = period
        closed = last_closed.get(account_id)
        if closed is not None and period <= closed:
            target = period_bounds(closed)[1].date()
        if (account_id, target) not in drafts:
            drafts[(account_id, target)] = draft_invoice(account_id, target).pk
        out[(account_id, period)] = drafts[(account_id, target)]
    return out
