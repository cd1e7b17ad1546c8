"""Reserved capacity coverage: which usage records a reserved plan covers."""

from __future__ import annotations

from collections import defaultdict
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from django.db import transaction
from django.db.models import F, Q

from billing import pricing
from billing.models import (
    Invoice,
    ReservedPlan,
    Tier,
    UsageRecord,
)
from billing.pricing import period_bounds


@transaction.atomic
def usage_apply_coverage(*, account_id: int, period_start: date) -> int:
    """Recompute which usage of the account's reserved models is covered in an open month.
    Returns how many records changed. A closed month is never touched."""
    if (
        Invoice.objects.filter(account_id=account_id, period_start=period_start)
        .exclude(status=Invoice.Status.DRAFT)
        .exists()
    ):
        return 0
    start, end = period_bounds(period_start)
    plans = list(
        ReservedPlan.objects.filter(account_id=account_id, starts_at__lt=end, ends_at__gt=start)
    )
    epoch = int(start.timestamp())

    def sec(moment: datetime) -> int:
        return int(moment.timestamp()) - epoch

    by_model: dict[int, list[pricing.CapacityStep]] = defaultdict(list)
    for plan in plans:
        by_model[plan.gpu_model_id].append(
            pricing.CapacityStep(
                sec(max(plan.starts_at, start)),
                sec(min(plan.ends_at, end)),
                plan.gpus * pricing.MILLI,
            )
        )
    drafts = UsageRecord.objects.filter(
        account_id=account_id, period_start=period_start, invoice__status=Invoice.Status.DRAFT
    )
    # usage of models without a reservation is never covered (reset it if a plan went away),
    # nor is fault-credited usage: it is not billed, so it must not use up the reservation
    reset = drafts.filter(covered_milli_seconds__gt=0).filter(
        Q(fault_credit=True) | ~Q(gpu_model_id__in=list(by_model))
    )
    changed_count = reset.update(covered_milli_seconds=0, amount=F("gross_amount"))
    if not by_model:
        return changed_count
    records = drafts.filter(gpu_model_id__in=list(by_model), fault_credit=False).values_list(
        "pk",
        "gpu_model_id",
        "slice_start",
        "slice_end",
        "billed_milli",
        "milli_seconds",
        "covered_milli_seconds",
        "tier",
        "rate",
    )
    grouped: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in records:
        grouped[row[1]].append(row)
    # most changes share a value (an hour fully covered, or not at all): one UPDATE per value
    changes: dict[tuple[int, Decimal], list[int]] = defaultdict(list)
    for model_id, rows in grouped.items():
        items = [
            pricing.CoverageItem(
                key=pk,
                start=sec(left),
                end=sec(right),
                milli=billed,
                priority=0 if tier == Tier.ON_DEMAND else 1,
            )
            for pk, _, left, right, billed, _, _, tier, _ in rows
        ]
        covered = pricing.allocate_coverage(items, by_model[model_id])
        for pk, _, _, _, _, ms, old, _, rate in rows:
            new = covered.get(pk, 0)
            if new != old:
                changes[(new, pricing.usage_amount(ms - new, rate))].append(pk)
    for (new, amount), pks in changes.items():
        changed_count += UsageRecord.objects.filter(pk__in=pks).update(
            covered_milli_seconds=new, amount=amount
        )
    return changed_count
