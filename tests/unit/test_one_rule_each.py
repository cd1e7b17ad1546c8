"""Rules that used to be written in several places: each is now stated once, and every former
user agrees with it (the database-backed users are checked in tests/billing/test_one_rule_each.py).
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone
from decimal import Decimal

import pytest

from billing import pricing
from billing.models import PriceVersion
from scheduler.admission import JobSpec
from scheduler.core import periods
from scheduler.core.model import (
    JobRequest,
    device_share_milli,
    gpu_capacity_milli,
    gpu_demand_milli,
    gpus_requested,
)
from scheduler.models import Gpu, Job

# (gpus, nodes, gpus per node, milli per GPU): whole GPUs, a fraction, a fixed gang layout.
SHAPES = [(1, None, None, 1000), (3, None, None, 1000), (1, None, None, 250), (8, 2, 4, 1000)]


@pytest.mark.parametrize(("gpus", "nodes", "per_node", "milli"), SHAPES)
def test_the_gpus_a_job_asks_for_agree(gpus, nodes, per_node, milli):
    spec = JobSpec(
        name="x", command="true", gpus=gpus, nodes=nodes, gpus_per_node=per_node, gpu_milli=milli
    )
    job = Job(gpus=gpus, nodes=nodes, gpus_per_node=per_node, gpu_milli=milli)
    request = JobRequest(
        job_id=1, project="p", submitted_at=0.0, gpus=gpus, nodes=nodes,
        gpus_per_node=per_node, gpu_milli=milli,
    )  # fmt: skip
    devices = nodes * per_node if nodes else gpus
    assert spec.gpu_count == job.gpu_count == request.total_gpus == devices
    assert gpus_requested(gpus, nodes, per_node) == devices
    demand = gpu_demand_milli(gpus, nodes, per_node, milli)
    assert demand == devices * milli
    assert spec.gpu_fraction * 1000 == job.gpu_demand_milli == request.gpu_milli_total == demand


@pytest.mark.parametrize(
    ("sharing", "factor", "capacity"),
    [("exclusive", 4, 1000), ("time_slice", 2, 2000), ("mps", 4, 4000), ("time_slice", 1, 1000)],
)
def test_gpu_capacity_agrees(sharing, factor, capacity):
    gpu = Gpu(sharing_mode=sharing, oversubscription=factor)
    assert gpu.capacity_milli == gpu_capacity_milli(sharing, factor) == capacity


def test_the_part_of_a_device_a_share_holds_is_billing_s_rule():
    assert device_share_milli(1000, 1000) == 1000
    assert device_share_milli(500, 2000) == 250  # a time-sliced ×2 device: half of a half
    assert device_share_milli(333, 2000) == 166  # rounded down, in the customer's favour
    assert device_share_milli(4000, 2000) == 1000  # never more than one GPU
    with pytest.raises(ValueError):
        device_share_milli(0, 1000)
    assert not hasattr(pricing, "billed_share_milli")  # billing has no copy of its own


def test_the_preemptible_price_is_the_price_lists_rule():
    version = PriceVersion(
        on_demand_per_gpu_hour=Decimal("2.5000"), preemptible_discount=Decimal("0.6")
    )
    assert version.rate(preemptible=True) == pricing.effective_rate(
        on_demand=Decimal("2.5000"), preemptible=True, preemptible_discount=Decimal("0.6")
    )
    assert version.rate(preemptible=True) == Decimal("1.0000")
    assert version.rate(preemptible=False) == Decimal("2.5000")


def test_reserved_terms_are_the_named_terms():
    version = PriceVersion(
        reserved_discount_1m=Decimal("0.1"),
        reserved_discount_12m=Decimal("0.3"),
        reserved_discount_36m=Decimal("0.5"),
    )
    assert [version.reserved_discount(t) for t in pricing.RESERVED_TERMS_MONTHS] == [
        Decimal("0.1"),
        Decimal("0.3"),
        Decimal("0.5"),
    ]
    with pytest.raises(KeyError):
        version.reserved_discount(6)


def test_the_period_helpers_are_the_core_s():
    moment = datetime(2025, 3, 31, 23, 59, 59, tzinfo=UTC)
    assert pricing.month_start is periods.month_start
    assert pricing.floor_hour is periods.floor_hour
    assert pricing.next_month is periods.next_month
    start, end = pricing.month_bounds(moment)
    assert (start, end) == pricing.period_bounds(pricing.period_of(moment))
    assert pricing.period_of(moment) == date(2025, 3, 1)
    assert end == datetime(2025, 4, 1, tzinfo=UTC)
    # an instant given in another zone belongs to its UTC month
    east = datetime(2025, 4, 1, 1, 0, tzinfo=UTC).astimezone(timezone(timedelta(hours=3)))
    assert periods.month_start(east) == datetime(2025, 4, 1, tzinfo=UTC)
