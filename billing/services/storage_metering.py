"""Storage metering: volumes' size limits × time become storage usage records (GB-months) on
the month's draft invoice.

What is billed is the size limit a volume holds (what the project's storage quota counts), from
its creation to its deletion, not what its files take: the limit is what the platform keeps
for it. Scratch volumes are not metered (their space exists only while a job runs, with the
job's GPUs); node-local and shared volumes and datasets are. A dataset is one volume, metered
once however many jobs mount it. Slices end at every hour boundary (so at month boundaries),
at price changes and at the deletion; a volume is metered to the last whole hour, so slices
are deterministic and unique per (volume, slice start): metering twice never double-counts.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import NamedTuple

from django.db import transaction
from django.db.models import Count, F, OuterRef, Q, Subquery, Sum
from django.utils import timezone

from billing import pricing
from billing.models import Invoice, StoragePrice, StorageUsageRecord
from billing.pricing import period_of
from billing.services.accounts import accounts_for_projects
from billing.services.metering import _open_pages
from billing.services.prices import storage_price_seed
from foundation.db import insert_rows
from storage.models import Volume, VolumeKind


class _StorageRow(NamedTuple):
    """One storage usage record as written (`STORAGE_FIELDS` order)."""

    volume: int
    project: int
    account: int
    price: int
    period_start: date
    slice_start: datetime
    slice_end: datetime
    size_gib: int
    gib_seconds: int
    rate: Decimal
    amount: Decimal
    created_at: datetime
    invoice: int | None


STORAGE_FIELDS = _StorageRow._fields


class _Meterable(NamedTuple):
    """What metering reads of a volume, with the end of its last metered slice."""

    pk: int
    project_id: int
    size_gib: int
    created_at: datetime
    deleted_at: datetime | None
    until: datetime | None  # None: never metered


class _Prices:
    """The storage price versions, oldest first: which one is in effect at a moment."""

    def __init__(self) -> None:
        self.versions = list(StoragePrice.objects.order_by("effective_from"))
        self.starts = [v.effective_from for v in self.versions]

    def at(self, moment: datetime) -> StoragePrice:
        index = bisect.bisect_right(self.starts, moment) - 1
        return self.versions[max(index, 0)]

    def changes_within(self, start: datetime, end: datetime) -> list[datetime]:
        return [s for s in self.starts if start < s < end]


def storage_meter(
    *, now: datetime | None = None, project_ids: Collection[int] | None = None
) -> int:
    """Meter every metered volume (of `project_ids`, or all) to the last whole hour before
    `now`, or to its deletion. Returns how many records were written."""
    now = now or timezone.now()
    horizon = pricing.floor_hour(now)
    storage_price_seed()
    prices = _Prices()
    last = StorageUsageRecord.objects.filter(volume=OuterRef("pk")).order_by("-slice_end")
    volumes = (
        Volume.objects.exclude(kind=VolumeKind.SCRATCH)
        .filter(created_at__lt=horizon)
        .annotate(until=Subquery(last.values("slice_end")[:1]))
        # a deleted volume metered to its deletion is done: it is not read again
        .filter(
            Q(deleted_at__isnull=True)
            | Q(until__isnull=True)
            | Q(until__lt=F("deleted_at") - timedelta(seconds=1))
        )
    )
    if project_ids is not None:
        volumes = volumes.filter(project_id__in=project_ids)
    rows = [
        _Meterable._make(row)
        for row in volumes.order_by("pk").values_list(
            "pk", "project_id", "size_gib", "created_at", "deleted_at", "until"
        )
    ]
    written = 0
    for k in range(0, len(rows), 500):
        written += _meter_batch(rows[k : k + 500], prices, horizon)
    return written


@transaction.atomic
def _meter_batch(rows: list[_Meterable], prices: _Prices, horizon: datetime) -> int:
    accounts = accounts_for_projects({row.project_id for row in rows})
    written_at = timezone.now()
    records: list[_StorageRow] = []
    for volume_id, project_id, size_gib, created_at, deleted_at, until in rows:
        start = pricing.floor_second(created_at)
        end = horizon if deleted_at is None else min(horizon, pricing.floor_second(deleted_at))
        begin = max(start, until) if until is not None else start
        for left, right in pricing.slice_interval(begin, end, prices.changes_within(begin, end)):
            price = prices.at(left)
            gib_seconds = size_gib * int((right - left).total_seconds())
            records.append(
                _StorageRow(
                    volume=volume_id,
                    project=project_id,
                    account=accounts[project_id],
                    price=price.pk,
                    period_start=period_of(left),
                    slice_start=left,
                    slice_end=right,
                    size_gib=size_gib,
                    gib_seconds=gib_seconds,
                    rate=price.per_gib_month,
                    amount=pricing.storage_amount(gib_seconds, price.per_gib_month),
                    created_at=written_at,
                    invoice=None,
                )
            )
    pages = _open_pages({(r.account, r.period_start) for r in records})
    return insert_rows(
        StorageUsageRecord,
        STORAGE_FIELDS,
        [r._replace(invoice=pages[(r.account, r.period_start)]) for r in records],
        ignore_conflicts=True,
    )


class StorageGroup(NamedTuple):
    """The storage records of one invoice, one month and one rate: one invoice line."""

    period_start: date
    rate: Decimal
    gib_seconds: int
    amount: Decimal
    records: int


def storage_line_groups(invoice: Invoice) -> list[StorageGroup]:
    return [
        StorageGroup(g["period_start"], g["rate"], g["gs"], g["cost"], g["n"])
        for g in StorageUsageRecord.objects.filter(invoice=invoice)
        .values("period_start", "rate")
        .annotate(gs=Sum("gib_seconds"), cost=Sum("amount"), n=Count("id"))
        .order_by("-period_start", "rate")
    ]
