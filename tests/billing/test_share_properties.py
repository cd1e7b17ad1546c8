"""Property tests over random placements, shares, capacity changes, plans, credits and price
versions: each GPU-second is billed once, at the share frozen at placement; a credit pays only
for what falls inside its validity; the invoice is the sum of its lines."""

from __future__ import annotations

import itertools
from collections import defaultdict
from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from billing import pricing, services
from billing.models import CreditApplication, UsageRecord
from scheduler.core.model import billed_share_milli
from scheduler.models import Gpu
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db
T0 = at("2025-02-27 00:00")
MARCH = date(2025, 3, 1)


@st.composite
def placements(draw):
    """Shares on the time-sliced L4 GPUs (×2 at placement) with the memory each holds."""
    out = []
    for gpu_index in range(2):
        left = 2000
        for _ in range(draw(st.integers(0, 3))):
            if left <= 0:
                break
            share = draw(st.integers(1, left))
            left -= share
            start = draw(st.integers(0, 25 * 86400))
            out.append(
                {
                    "gpu": gpu_index,
                    "share": share,
                    "memory": draw(st.integers(0, 24_000)),
                    "start": start,
                    "end": start + draw(st.integers(1, 5 * 86400)),
                    "reason": draw(st.sampled_from(["completed", "node_lost", "cancelled"])),
                }
            )
    return out


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    plan=placements(),
    new_factor=st.integers(1, 4),
    price_change=st.one_of(st.none(), st.integers(1, 30 * 86400)),
    price_micro=st.integers(0, 999_999),
    reserved=st.integers(0, 1),
    credit=st.one_of(st.none(), st.tuples(st.integers(0, 31 * 86400), st.integers(1, 31 * 86400))),
)
def test_each_gpu_second_is_billed_once_at_the_share_frozen_at_placement(
    lab, place, plan, new_factor, price_change, price_micro, reserved, credit
):
    gpus = list(Gpu.objects.filter(model=lab["l4"]).order_by("pk")[:2])
    with transaction.atomic():
        services.price_list_seed()
        if price_change is not None:
            services.price_publish(
                actor=None,
                gpu_model=lab["l4"],
                effective_from=T0 + timedelta(seconds=price_change, microseconds=price_micro),
                on_demand_per_gpu_hour=Decimal("0.7777"),
                now=T0,
            )
        account = services.account_open_for_project(project=lab["a"])
        if reserved:
            services.reserved_plan_create(
                actor=None,
                account=account,
                gpu_model=lab["l4"],
                gpus=1,
                term_months=1,
                starts_at=at("2025-03-07 12:00"),
            )
        grant_window = None
        if credit is not None:
            begin = T0 + timedelta(days=2, seconds=credit[0])
            grant_window = (begin, begin + timedelta(seconds=credit[1]))
            services.credit_grant(
                actor=None,
                account=account,
                amount=Decimal("1000000"),
                granted_at=grant_window[0],
                expires_at=grant_window[1],
            )
        allocs = [
            place(
                gpu=gpus[p["gpu"]],
                share=p["share"],
                memory_mib=p["memory"],
                start=T0 + timedelta(seconds=p["start"]),
                end=T0 + timedelta(seconds=p["end"]),
                end_reason=p["reason"],
            )
            for p in plan
        ]
        frozen = {
            a.pk: billed_share_milli(a.share_milli, 2000, a.memory_mib, a.gpu.memory_mib)
            for a in allocs
        }
        # the devices' sharing changes after placement (behind the admin's refusal)
        Gpu.objects.filter(pk__in=[g.pk for g in gpus]).update(oversubscription=new_factor)
        now = at("2025-04-01 00:10")
        services.usage_meter(now=at("2025-03-15 07:30"))
        invoice = services.invoice_close(account_id=account.pk, period_start=MARCH, now=now)
        services.usage_meter(now=now)

        seconds = defaultdict(int)
        slices = defaultdict(list)
        for r in UsageRecord.objects.all():
            assert r.billed_milli == frozen[r.allocation_id]
            assert r.milli_seconds == r.seconds * r.billed_milli
            seconds[r.allocation_id] += r.seconds
            slices[r.allocation_id].append((r.slice_start, r.slice_end))
        for a in allocs:
            whole = int((a.ended_at - a.started_at).total_seconds())
            assert seconds[a.pk] == whole  # every second once: none lost, none twice
            edges = sorted(slices[a.pk])
            assert all(left[1] == right[0] for left, right in itertools.pairwise(edges))

        lines = list(invoice.lines.all())
        assert sum((line.amount for line in lines), Decimal(0)) == invoice.total
        assert invoice.total == invoice.subtotal - invoice.credits_applied + invoice.tax
        drawn = sum(
            (c.amount for c in CreditApplication.objects.filter(invoice=invoice)), Decimal(0)
        )
        assert drawn == invoice.credits_applied
        if grant_window is None:
            assert drawn == 0
        else:
            inside = sum(
                (
                    r.amount
                    for r in UsageRecord.objects.filter(
                        invoice=invoice,
                        fault_credit=False,
                        slice_start__gte=grant_window[0],
                        slice_start__lt=grant_window[1],
                    )
                ),
                Decimal(0),
            )
            fees = sum(
                (
                    line.amount
                    for line in lines
                    if line.kind == "reserved_fee"
                    and line.plan.starts_at >= grant_window[0]
                    and line.plan.starts_at < grant_window[1]
                ),
                Decimal(0),
            )
            assert drawn <= pricing.to_cents(inside) + fees + Decimal("0.01")
        transaction.set_rollback(True)
