"""Metering: allocations become usage records on the month's draft invoice, platform faults are credited."""

from __future__ import annotations

from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from typing import NamedTuple

from django.db import transaction
from django.db.models import F, Q, QuerySet
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
from billing.selectors import stopped_by_budget_cap_among
from billing.services.accounts import accounts_for_projects
from billing.services.corrections import usage_fault_credit
from billing.services.coverage import usage_apply_coverage
from billing.services.drafts import draft_invoice
from billing.services.prices import price_list_seed
from foundation.db import AnyOf, insert_rows
from portal.errors import DomainError
from scheduler.models import Allocation


@dataclass(frozen=True)
class MeterResult:
    allocations: int
    records: int
    credited: int


class _Meterable(NamedTuple):
    """What metering reads of an allocation (with its job and its meter), one row each."""

    pk: int
    job_id: int
    project_id: int
    preemptible: bool
    checkpoint: str
    borrowed: bool
    gpu_model_id: int
    share_milli: int
    billed_milli: int | None
    started_at: datetime
    ended_at: datetime | None
    end_reason: str
    fault_corroborated_at: datetime | None
    metered_until: datetime | None  # None: never metered
    fault_credited: bool | None


_METERABLE_COLUMNS = (
    "pk",
    "job_id",
    "job__project_id",
    "job__preemptible",
    "job__checkpoint",
    "borrowed",
    "gpu_model_id",
    "share_milli",
    "billed_milli",
    "started_at",
    "ended_at",
    "end_reason",
    "fault_corroborated_at",
    "meter__metered_until",
    "meter__fault_credited",
)


class _UsageRow(NamedTuple):
    """One usage record as written (`USAGE_FIELDS` order)."""

    allocation: int
    job: int
    project: int
    account: int
    gpu_model: int
    price_version: int
    period_start: date
    slice_start: datetime
    slice_end: datetime
    seconds: int
    share_milli: int
    billed_milli: int
    milli_seconds: int
    covered_milli_seconds: int
    tier: str
    rate: Decimal
    gross_amount: Decimal
    amount: Decimal
    fault_credit: bool
    created_at: datetime
    invoice: int | None


USAGE_FIELDS = _UsageRow._fields
METER_FIELDS = ("allocation", "metered_until", "done", "fault_credited")


def usage_meter(
    *,
    now: datetime | None = None,
    allocation_ids: Collection[int] | None = None,
    project_ids: set[int] | None = None,
    chunk: int = 1000,
) -> MeterResult:
    """Meter allocations into usage records, per second, sliced at the allocation end, every
    hour (so every month boundary) and every price change. Running allocations are metered to
    the last whole hour; the open hour is estimated on the fly by readers. Idempotent: slices
    are deterministic and unique per (allocation, slice start).

    Set-based (`bench.slurm_metering`): each batch of `chunk` allocations is one read of plain
    rows, its slices go in one insert (`foundation.db.insert_rows`, existing slices skipped by the
    unique constraint) and its meters in one upsert; only the rare allocations that need more
    (a share frozen before it was kept, a fault to credit) are loaded as models."""
    now = now or timezone.now()
    horizon = pricing.floor_hour(now)
    price_list_seed()
    table = PriceTable.load()
    qs = Allocation.objects.filter(started_at__lt=now).filter(
        Q(meter__isnull=True)
        | Q(meter__done=False)
        # metered before its GPU fault was corroborated: credited now
        | Q(
            meter__fault_credited=False,
            end_reason=pricing.GPU_FAULT,
            fault_corroborated_at__isnull=False,
        )
    )
    if project_ids is not None:
        qs = qs.filter(job__project_id__in=project_ids)

    def read(batch: QuerySet[Allocation]) -> list[_Meterable]:
        return [_Meterable._make(row) for row in batch.values_list(*_METERABLE_COLUMNS)]

    def batches() -> Iterator[list[_Meterable]]:
        if allocation_ids is not None:
            # one array parameter per batch, however many ids were asked for
            ids = sorted(set(allocation_ids))
            for k in range(0, len(ids), chunk):
                yield read(qs.filter(AnyOf(F("pk"), ids[k : k + chunk])).order_by("pk"))
            return
        last_pk = 0
        while batch := read(qs.filter(pk__gt=last_pk).order_by("pk")[:chunk]):
            last_pk = batch[-1].pk
            yield batch

    total = MeterResult(0, 0, 0)
    touched: set[tuple[int, date]] = set()
    for batch in batches():
        if not batch:
            continue
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
    batch: list[_Meterable],
    *,
    table: PriceTable,
    horizon: datetime,
    now: datetime,
    touched: set[tuple[int, date]],
) -> MeterResult:
    """One batch in named steps: slice each allocation into usage rows and its meter, leave
    out of the fault credits the stops the customer's own cap caused, write the rows, credit
    the faults. `touched` gains the (account, month)s whose coverage is to be worked out."""
    accounts = accounts_for_projects({a.project_id for a in batch})
    slicer = _Slicer(table=table, horizon=horizon, now=now, legacy=_legacy_billed_shares(batch))
    metered = _Metered()
    for alloc in batch:
        slicer.meter(alloc, account_id=accounts[alloc.project_id], into=metered)
    faults = _faults_to_credit(metered)
    _write_usage(metered, touched=touched)
    _credit_faults(faults, accounts=accounts, touched=touched)
    return MeterResult(len(batch), len(metered.records), len(faults))


def _legacy_billed_shares(batch: list[_Meterable]) -> dict[int, int]:
    """Rows placed before the billed share was kept: the rule, on their GPU as it is now."""
    return {
        a.pk: a.billed_share()
        for a in Allocation.objects.filter(
            pk__in=[a.pk for a in batch if a.billed_milli is None]
        ).select_related("gpu")
    }


@dataclass
class _Metered:
    """A batch's usage rows and meters, and the allocations whose fault may be credited."""

    records: list[_UsageRow] = field(default_factory=list)
    meters: list[tuple[int, datetime, bool, bool]] = field(default_factory=list)
    credit: list[_Meterable] = field(default_factory=list)
    preempted: list[_Meterable] = field(default_factory=list)


@dataclass
class _Slicer:
    """Slices allocations into usage rows at the hour and at each price change."""

    table: PriceTable
    horizon: datetime
    now: datetime
    legacy: dict[int, int]
    written_at: datetime = field(default_factory=timezone.now)
    rates: dict[tuple[int, bool], Decimal] = field(default_factory=dict)

    def meter(self, alloc: _Meterable, *, account_id: int, into: _Metered) -> None:
        """One allocation metered from where its meter stands to its end (or the last hour)."""
        start = pricing.floor_second(alloc.started_at)
        if alloc.ended_at is not None and alloc.ended_at <= self.now:
            end, done = max(start, pricing.floor_second(alloc.ended_at)), True
        else:
            end, done = max(start, self.horizon), False
        metered = alloc.metered_until
        begin = max(start, metered) if metered is not None else start
        preemptible = alloc.preemptible or alloc.borrowed
        into.records.extend(
            self.usage_rows(alloc, begin, end, preemptible=preemptible, account_id=account_id)
        )
        credited = done and pricing.fault_credited(
            end_reason=alloc.end_reason,
            preemptible=preemptible,
            has_checkpoint=bool(alloc.checkpoint),
            corroborated=alloc.fault_corroborated_at is not None,
        )
        if credited:
            into.credit.append(alloc)
            if alloc.end_reason == Allocation.EndReason.PREEMPTED:
                into.preempted.append(alloc)
        into.meters.append((alloc.pk, max(begin, end), done, credited))

    def usage_rows(
        self,
        alloc: _Meterable,
        begin: datetime,
        end: datetime,
        *,
        preemptible: bool,
        account_id: int,
    ) -> Iterator[_UsageRow]:
        """The usage rows of [begin, end): one per hour and price version."""
        tier = (Tier.PREEMPTIBLE if preemptible else Tier.ON_DEMAND).value
        billed = alloc.billed_milli if alloc.billed_milli is not None else self.legacy[alloc.pk]
        cuts = self.table.changes_within(alloc.gpu_model_id, begin, end)
        for left, right in pricing.slice_interval(begin, end, cuts):
            version = self.table.at(alloc.gpu_model_id, left)
            if version is None:  # unreachable after price_list_seed; never bill a guess
                raise DomainError(f"No price for GPU model {alloc.gpu_model_id} at {left}.")
            rate = self.rates.get((version.pk, preemptible))
            if rate is None:
                rate = self.rates[(version.pk, preemptible)] = version.rate(preemptible=preemptible)
            seconds = int((right - left).total_seconds())
            milli_seconds = seconds * billed
            gross = pricing.usage_amount(milli_seconds, rate)
            yield _UsageRow(
                allocation=alloc.pk,
                job=alloc.job_id,
                project=alloc.project_id,
                account=account_id,
                gpu_model=alloc.gpu_model_id,
                price_version=version.pk,
                period_start=period_of(left),
                slice_start=left,
                slice_end=right,
                seconds=seconds,
                share_milli=alloc.share_milli,
                billed_milli=billed,
                milli_seconds=milli_seconds,
                covered_milli_seconds=0,  # coverage is worked out after the batch
                tier=tier,
                rate=rate,
                gross_amount=gross,
                amount=gross,
                fault_credit=False,  # the fault policy marks it below
                created_at=self.written_at,
                invoice=None,
            )


def _faults_to_credit(metered: _Metered) -> list[int]:
    """The allocations whose fault is credited now: not those the customer's cap stopped
    (one read for the batch's preempted allocations), nor those credited already."""
    capped = stopped_by_budget_cap_among(
        [(a.pk, a.job_id, a.started_at, a.ended_at) for a in metered.preempted]
    )
    if capped:
        metered.meters = [
            (pk, until, done, ok and pk not in capped) for pk, until, done, ok in metered.meters
        ]
    return [a.pk for a in metered.credit if a.pk not in capped and not a.fault_credited]


def _write_usage(metered: _Metered, *, touched: set[tuple[int, date]]) -> None:
    """The usage rows in one insert, onto their open invoice pages, and the meters in one upsert."""
    pairs = {(r.account, r.period_start) for r in metered.records}
    touched.update(pairs)
    pages = _open_pages(pairs)
    insert_rows(
        UsageRecord,
        USAGE_FIELDS,
        [r._replace(invoice=pages[(r.account, r.period_start)]) for r in metered.records],
        ignore_conflicts=True,
    )
    insert_rows(
        AllocationMeter,
        METER_FIELDS,
        metered.meters,
        update_conflicts=METER_FIELDS[1:],
        unique_fields=METER_FIELDS[:1],
    )


def _credit_faults(
    faults: list[int], *, accounts: dict[int, int], touched: set[tuple[int, date]]
) -> None:
    """Credit each fault; its months' coverage is worked out again (credited usage uses up no
    reservation)."""
    for faulty in Allocation.objects.filter(pk__in=faults).select_related("job").order_by("pk"):
        account_id = accounts[faulty.job.project_id]
        usage_fault_credit(alloc=faulty, account_id=account_id)
        touched.update(
            (account_id, period)
            for period in UsageRecord.objects.filter(
                allocation=faulty, invoice__status=Invoice.Status.DRAFT
            )
            .values_list("period_start", flat=True)
            .distinct()
        )


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
