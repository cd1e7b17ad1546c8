"""Metering: per-second slices, idempotent by construction, priced by the version in effect."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection

from billing import services
from billing.models import AllocationMeter, PriceVersion, UsageRecord
from scheduler.models import Gpu
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db


def price(model, when, rate, **kw):
    services.price_list_seed()
    return services.price_publish(
        actor=None,
        gpu_model=model,
        effective_from=when,
        on_demand_per_gpu_hour=Decimal(rate),
        now=when - timedelta(days=1),
        **kw,
    )


def test_ended_allocation_is_sliced_per_hour_and_sums_to_its_seconds(lab, place):
    alloc = place(start=at("2025-03-10 10:20:30"), end=at("2025-03-10 13:05:10"))
    result = services.usage_meter(now=at("2025-03-11 00:00"))
    rows = list(UsageRecord.objects.filter(allocation=alloc).order_by("slice_start"))
    assert result.records == len(rows) == 4
    assert [r.seconds for r in rows] == [2370, 3600, 3600, 310]
    assert sum(r.seconds for r in rows) == int((alloc.ended_at - alloc.started_at).total_seconds())
    assert all(r.milli_seconds == r.seconds * 1000 for r in rows)
    rate = lab["h100"].price_per_gpu_hour
    total = sum(r.amount for r in rows)
    assert abs(total - rate * Decimal(9880) / 3600) < Decimal("0.00001")
    assert AllocationMeter.objects.get(allocation=alloc).done


def test_rerunning_metering_never_double_counts(lab, place):
    place(start=at("2025-03-10 10:00"), end=at("2025-03-10 15:30"))
    running = place(start=at("2025-03-10 12:15"))
    services.usage_meter(now=at("2025-03-10 16:40"))
    first = sorted(UsageRecord.objects.values_list("allocation_id", "slice_start", "seconds"))
    # a retried task, and a worker that lost its cursor (crashed after insert, before update)
    services.usage_meter(now=at("2025-03-10 16:50"))
    AllocationMeter.objects.all().delete()
    services.usage_meter(now=at("2025-03-10 16:55"))
    assert (
        sorted(UsageRecord.objects.values_list("allocation_id", "slice_start", "seconds")) == first
    )
    # the running allocation is metered to the last whole hour only
    assert UsageRecord.objects.filter(allocation=running).latest("slice_end").slice_end == at(
        "2025-03-10 16:00"
    )
    services.usage_meter(now=at("2025-03-10 18:01"))
    assert UsageRecord.objects.filter(allocation=running).latest("slice_end").slice_end == at(
        "2025-03-10 18:00"
    )
    seconds = sum(UsageRecord.objects.filter(allocation=running).values_list("seconds", flat=True))
    assert seconds == 5 * 3600 + 45 * 60


@pytest.mark.django_db(transaction=True)
def test_concurrent_meters_write_each_slice_once(lab, place):
    for i in range(6):
        place(start=at("2025-03-01 00:00") + timedelta(minutes=7 * i), end=at("2025-03-03 05:00"))

    def run(_: int) -> int:
        try:
            return services.usage_meter(now=at("2025-03-05 00:00")).records
        finally:
            connection.close()

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(run, range(4)))
    per_alloc = UsageRecord.objects.values_list("allocation_id", "seconds")
    totals: dict[int, int] = {}
    for alloc_id, seconds in per_alloc:
        totals[alloc_id] = totals.get(alloc_id, 0) + seconds
    assert sorted(totals.values()) == sorted(
        int(
            (
                at("2025-03-03 05:00") - (at("2025-03-01 00:00") + timedelta(minutes=7 * i))
            ).total_seconds()
        )
        for i in range(6)
    )


def test_price_change_mid_job_splits_the_slice(lab, place):
    base = price(lab["h100"], at("2025-01-01 00:00"), "4.0000")
    new = price(lab["h100"], at("2025-03-10 12:30"), "2.0000")
    place(start=at("2025-03-10 12:00"), end=at("2025-03-10 13:00"))
    services.usage_meter(now=at("2025-03-11 00:00"))
    rows = list(UsageRecord.objects.order_by("slice_start"))
    assert [(r.price_version_id, r.seconds, r.rate, r.amount) for r in rows] == [
        (base.pk, 1800, Decimal("4.0000"), Decimal("2.000000")),
        (new.pk, 1800, Decimal("2.0000"), Decimal("1.000000")),
    ]


def test_a_price_change_never_rewrites_the_past(lab):
    services.price_list_seed()
    from portal.errors import DomainError

    with pytest.raises(DomainError, match="past"):
        services.price_publish(
            actor=None,
            gpu_model=lab["h100"],
            effective_from=at("2020-01-01 00:00"),
            on_demand_per_gpu_hour=Decimal("1"),
        )


def test_month_boundary_splits_usage_into_both_months(lab, place):
    place(start=at("2025-03-31 23:30"), end=at("2025-04-01 00:45"))
    services.usage_meter(now=at("2025-04-02 00:00"))
    by_period = {
        str(p): s
        for p, s in UsageRecord.objects.values_list("period_start").annotate(
            s=__import__("django.db.models", fromlist=["Sum"]).Sum("seconds")
        )
    }
    assert by_period == {"2025-03-01": 1800, "2025-04-01": 2700}


def test_fraction_is_billed_as_fraction_and_time_slicing_never_exceeds_one_gpu_hour(lab, place):
    l4_gpu = Gpu.objects.filter(model=lab["l4"]).order_by("pk").first()  # time-sliced ×2
    assert l4_gpu.capacity_milli == 2000
    h100_gpu = Gpu.objects.filter(model=lab["h100"]).order_by("pk").first()
    half = place(gpu=h100_gpu, share=500, start=at("2025-03-01 00:00"), end=at("2025-03-01 01:00"))
    shares = [
        place(gpu=l4_gpu, share=1000, start=at("2025-03-01 00:00"), end=at("2025-03-01 01:00"))
        for _ in range(2)
    ]
    services.usage_meter(now=at("2025-03-02 00:00"))
    assert UsageRecord.objects.get(allocation=half).milli_seconds == 500 * 3600
    on_l4 = sum(
        UsageRecord.objects.filter(allocation__in=shares).values_list("milli_seconds", flat=True)
    )
    assert on_l4 == 1000 * 3600  # two full shares of a ×2 GPU: one GPU-hour in the hour


def test_preemptible_and_borrowed_pay_the_discounted_rate(lab, place):
    services.price_list_seed()
    version = PriceVersion.objects.get(gpu_model=lab["h100"])
    a = place(preemptible=True, start=at("2025-03-01 00:00"), end=at("2025-03-01 01:00"))
    b = place(borrowed=True, start=at("2025-03-01 00:00"), end=at("2025-03-01 01:00"))
    services.usage_meter(now=at("2025-03-02 00:00"))
    expected = version.rate(preemptible=True)
    assert expected < version.on_demand_per_gpu_hour
    for alloc in (a, b):
        record = UsageRecord.objects.get(allocation=alloc)
        assert record.tier == "preemptible" and record.rate == expected


@pytest.mark.parametrize(
    ("end_reason", "preemptible", "checkpoint", "credited"),
    [
        ("node_lost", False, "/ckpt", True),
        ("gpu_fault", True, "", True),  # corroborated (below); uncorroborated: nothing
        ("preempted", False, "", True),
        ("preempted", False, "/ckpt", False),
        ("preempted", True, "", False),
        ("failed", False, "", False),
        ("completed", False, "", False),
    ],
)
def test_fault_policy(lab, place, end_reason, preemptible, checkpoint, credited):
    alloc = place(
        start=at("2025-03-01 00:00"),
        end=at("2025-03-01 02:00"),
        end_reason=end_reason,
        preemptible=preemptible,
        checkpoint=checkpoint,
    )
    if end_reason == "gpu_fault":
        alloc.fault_corroborated_at = at("2025-03-01 02:05")
        alloc.save()
    services.usage_meter(now=at("2025-03-02 00:00"))
    flags = set(UsageRecord.objects.filter(allocation=alloc).values_list("fault_credit", flat=True))
    assert flags == {credited}


def test_fault_after_earlier_slices_were_metered_credits_them_all(lab, place):
    alloc = place(start=at("2025-03-01 00:00"))
    services.usage_meter(now=at("2025-03-01 03:10"))
    assert UsageRecord.objects.filter(allocation=alloc, fault_credit=False).count() == 3
    alloc.ended_at, alloc.end_reason = at("2025-03-01 03:20"), "node_lost"
    alloc.save()
    services.usage_meter(now=at("2025-03-01 04:00"))
    assert UsageRecord.objects.filter(allocation=alloc).count() == 4
    assert not UsageRecord.objects.filter(allocation=alloc, fault_credit=False).exists()
