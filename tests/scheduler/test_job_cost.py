"""What a researcher is told a job costs is what billing charges for it.

The dry run and the job page quote from the GPUs the job gets once that is known (the model
it landed on, the part of a time-sliced device it holds); before that, a job that names no
model is quoted from the cheapest to the dearest model of the fleet that it may land on.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from billing.selectors import job_cost
from scheduler.cycle import run_cycle
from scheduler.estimates import job_hourly_cost
from scheduler.models import Allocation, GpuModel, Job

pytestmark = pytest.mark.django_db


@pytest.fixture
def lab(team, fleet):
    return {**team, **fleet}


def dry_run(api, user, **fields):
    body = {"project": "alpha", "name": "x", "command": "true", "runtime_estimate_s": 7200}
    resp = api(user).post("/api/v1/jobs/dry-run", {**body, **fields}, format="json")
    assert resp.status_code == 200, resp.content
    return resp.json()


def submit(api, user, **fields):
    body = {"project": "alpha", "name": "x", "command": "true", **fields}
    resp = api(user).post("/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return Job.objects.get(pk=resp.json()["id"])


def billed_for_its_first_hour(job: Job) -> Decimal:
    """What billing charges for the job's first hour on the GPUs it holds."""
    started = min(a.started_at for a in Allocation.objects.filter(job=job))
    return job_cost(job, now=started.replace(microsecond=0) + timedelta(hours=1))


def cents(amount: Decimal) -> Decimal:
    return amount.quantize(Decimal("0.01"))


def price(name: str) -> Decimal:
    return GpuModel.objects.get(name=name).price_per_gpu_hour


@pytest.mark.parametrize(
    "fields",
    [
        {"gpus": 1},  # any model: lands on an L4 or an H100, not on the catalog's cheapest
        {"gpus": 2, "gpu_model": "H100-80GB-SXM"},
        {"gpus": 1, "gpu_model": "L4"},  # a whole time-sliced ×2 device: one GPU-hour an hour
        {"gpu_milli": 500, "gpu_model": "L4"},  # half a slot of ×2: a quarter of the device
        {"gpu_milli": 500, "gpu_model": "L4", "preemptible": True},
    ],
)
def test_the_quote_where_it_starts_now_is_what_billing_charges(lab, api, fields):
    dry = dry_run(api, lab["member"], **fields)
    assert dry["would_start_now"] and dry["cost_per_hour_most"] is None
    job = submit(api, lab["member"], **fields)
    run_cycle()
    billed = billed_for_its_first_hour(job)
    assert billed > 0
    assert Decimal(dry["cost_per_hour"]) == billed
    assert Decimal(dry["cost_for_estimate"]) == 2 * billed
    assert job_hourly_cost(job).low == billed and job_hourly_cost(job).high is None
    detail = api(lab["member"]).get(f"/api/v1/jobs/{job.pk}").json()
    assert detail["cost"] == {"cost_per_hour": f"{billed:.2f}", "cost_per_hour_most": None}
    assert all(p["share_milli"] <= p["capacity_milli"] for p in detail["placement"])


def test_an_array_job_is_quoted_for_all_its_shards(lab, api):
    dry = dry_run(api, lab["member"], gpu_model="L4", shard_count=3)
    assert dry["would_start_now"]
    resp = api(lab["member"]).post(
        "/api/v1/jobs",
        {"project": "alpha", "name": "x", "command": "true", "gpu_model": "L4", "shard_count": 3},
        format="json",
    )
    run_cycle()
    shards = Job.objects.filter(pk__in=[j["id"] for j in resp.json()])
    assert len(shards) == 3
    assert Decimal(dry["cost_per_hour"]) == sum(billed_for_its_first_hour(j) for j in shards)


def test_a_quarter_of_a_time_sliced_l4(lab, api):
    dry = dry_run(api, lab["member"], gpu_milli=500, gpu_model="L4")
    assert Decimal(dry["cost_per_hour"]) == cents(price("L4") / 4)


def test_a_waiting_job_without_a_model_is_quoted_over_the_fleet_it_may_land_on(lab, api, client):
    # The fleet has 4 H100 (two nodes of 2) and 4 L4; the catalog's T4 is cheaper but absent.
    submit(api, lab["member"], gpus=4, gpu_model="H100-80GB-SXM")
    submit(api, lab["member"], gpus=4, gpu_model="L4")
    run_cycle()
    dry = dry_run(api, lab["member"], gpus=2, runtime_estimate_s=3600)
    assert not dry["would_start_now"]
    assert price("T4") < price("L4")  # the catalog's cheapest, not in this fleet
    assert Decimal(dry["cost_per_hour"]) == 2 * price("L4")
    assert Decimal(dry["cost_per_hour_most"]) == 2 * price("H100-80GB-SXM")
    waiting = submit(api, lab["member"], gpus=2)
    run_cycle()
    assert waiting.allocations.count() == 0
    cost = job_hourly_cost(waiting)
    assert (cost.low, cost.high) == (2 * price("L4"), 2 * price("H100-80GB-SXM"))
    detail = api(lab["member"]).get(f"/api/v1/jobs/{waiting.pk}").json()
    assert detail["cost"] == {
        "cost_per_hour": f"{2 * price('L4'):.2f}",
        "cost_per_hour_most": f"{2 * price('H100-80GB-SXM'):.2f}",
    }
    client.force_login(lab["member"])
    page = client.get(f"/jobs/{waiting.pk}/")
    assert page.status_code == 200
    text = page.content.decode()
    low, high = (cents(2 * price(name)) for name in ("L4", "H100-80GB-SXM"))
    assert f"${low} to ${high} per hour, by the GPU model it lands on" in text


def test_a_model_named_or_one_price_quotes_no_range(lab, api):
    submit(api, lab["member"], gpus=4, gpu_model="H100-80GB-SXM")
    run_cycle()
    waiting = submit(api, lab["member"], gpus=1, gpu_model="H100-80GB-SXM")
    run_cycle()
    assert job_hourly_cost(waiting).high is None
    # 40 GB and fp8 leaves only the H100 of this fleet (the H200 has no GPUs here)
    dry = dry_run(api, lab["member"], gpus=1, min_gpu_memory_gb=40, precisions=["fp8"])
    assert dry["cost_per_hour_most"] is None
    assert Decimal(dry["cost_per_hour"]) == price("H100-80GB-SXM")


def test_the_job_page_shows_the_placed_cost_and_the_share_in_words(lab, api, client):
    job = submit(api, lab["member"], gpus=1, gpu_model="L4")
    half = submit(api, lab["member"], gpu_milli=500, gpu_model="L4")
    run_cycle()
    client.force_login(lab["member"])
    text = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "whole GPU" in text and f"${billed_for_its_first_hour(job)} per hour" in text
    text = client.get(f"/jobs/{half.pk}/").content.decode()
    assert "500m of 2000m" in text and f"${billed_for_its_first_hour(half)} per hour" in text
    Job.objects.filter(pk=job.pk).update(state="succeeded")
    Allocation.objects.filter(job=job).update(ended_at=job.created_at + timedelta(hours=2))
    assert job_hourly_cost(Job.objects.get(pk=job.pk)) is None


def test_a_gpu_gone_since_the_plan_falls_back_to_the_plain_quote(lab):
    from scheduler.admission import JobSpec
    from scheduler.core.model import Share
    from scheduler.core.plan import Placement
    from scheduler.estimates import _placed_quote, quote

    spec = JobSpec(name="x", command="true", gpus=1, gpu_model=lab["l4"])
    gone = Placement(job_id=-1, shares=(Share(node_id=1, gpu_id=10**9, milli=1000),))
    assert _placed_quote(gone, spec, borrowed=False) == quote(spec)


def test_a_waiting_fraction_is_quoted_as_the_dry_run_quotes_it_and_billing_bills_it(
    lab, api, client
):
    """A fraction asking for half a device's memory bills its memory part (half a GPU), not
    its compute share: the job page and the API say so while it waits, as the dry run did."""
    member = lab["member"]
    fields = {"gpu_milli": 200, "gpu_memory_mib": lab["l4"].memory_mib // 2, "gpu_model": "L4"}
    fillers = [submit(api, member, gpus=4, gpu_model="L4") for _ in range(2)]  # every L4 slot
    run_cycle()
    dry = dry_run(api, member, **fields)
    assert not dry["would_start_now"]
    half = cents(price("L4") / 2)
    assert Decimal(dry["cost_per_hour"]) == half
    waiting = submit(api, member, **fields)
    run_cycle()
    assert waiting.allocations.count() == 0
    cost = job_hourly_cost(waiting)
    assert (cost.low, cost.high) == (half, None)
    detail = api(member).get(f"/api/v1/jobs/{waiting.pk}").json()
    assert detail["cost"] == {"cost_per_hour": f"{half}", "cost_per_hour_most": None}
    client.force_login(member)
    assert f"${half} per hour while it runs" in client.get(f"/jobs/{waiting.pk}/").content.decode()
    # once it runs, billing charges what it was quoted
    from scheduler.admission import job_cancel

    for job in fillers:
        job_cancel(actor=member, job=job)
    run_cycle()
    assert waiting.allocations.count() == 1
    assert billed_for_its_first_hour(waiting) == half
