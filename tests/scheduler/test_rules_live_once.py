"""Rules stated once, seen from each place that uses them: a second copy that drifts fails here.

Each test drives two (or more) users of one rule and checks they agree on the same data: the
fleet overview and the planner on a GPU's capacity; the agents' assignments, the dispatch and
the transitions on which states hold GPUs.
"""

from __future__ import annotations

import pytest
from django.utils import timezone

from monitoring.fleet import fleet_capacity, gpu_cells
from scheduler.cycle import build_state, run_cycle
from scheduler.dispatch import changes_assignments
from scheduler.models import ACTIVE_STATES, Allocation, Gpu, Job, JobState
from scheduler.nodes.assignments import assignments_for

pytestmark = pytest.mark.django_db


def test_the_fleet_overview_counts_each_gpus_capacity_as_the_planner_does(fleet):
    # every sharing mode, and factors the fixture lacks
    gpus = list(Gpu.objects.order_by("pk"))
    modes = [
        (Gpu.SharingMode.EXCLUSIVE, 1),
        (Gpu.SharingMode.EXCLUSIVE, 3),  # a factor on an exclusive GPU means nothing
        (Gpu.SharingMode.TIME_SLICE, 4),
        (Gpu.SharingMode.MPS, 2),
        (Gpu.SharingMode.MIG, 1),
    ]
    for gpu, (mode, factor) in zip(gpus, modes, strict=False):
        Gpu.objects.filter(pk=gpu.pk).update(sharing_mode=mode, oversubscription=factor)
    planner = {
        g.gpu_id: g.capacity_milli
        for n in build_state(now=timezone.now()).snapshot.nodes
        for g in n.gpus
    }
    overview = {c.gpu_id: c.capacity_milli for c in gpu_cells()}
    assert overview == planner
    assert overview == {g.pk: g.capacity_milli for g in Gpu.objects.all()}
    assert len(set(overview.values())) >= 3
    by_model = fleet_capacity(gpu_cells())
    assert sum(m.capacity_milli for m in by_model.values()) == sum(planner.values())


@pytest.mark.parametrize("state", list(JobState))
def test_a_job_holds_gpus_in_exactly_the_states_every_user_says(team, fleet, api, state):
    """Placed, then moved to each state: its node's agent is told to run it, and moving there
    from the queue changes the node's assignments, exactly in the states that hold GPUs."""
    resp = api(team["member"]).post(
        "/api/v1/jobs",
        {"project": "alpha", "name": "x", "command": "true", "gpu_model": "H100-80GB-SXM"},
        format="json",
    )
    job = Job.objects.get(pk=resp.json()["id"])
    run_cycle()
    alloc = Allocation.objects.get(job=job)
    Job.objects.filter(pk=job.pk).update(state=state)
    holds = state in ACTIVE_STATES
    told = [a["job_id"] for a in assignments_for(alloc.node)]
    assert (job.pk in told) == holds
    assert changes_assignments(JobState.QUEUED, state) == holds
    assert changes_assignments(state, JobState.SUCCEEDED) == holds


def test_leaving_a_state_that_holds_gpus_ends_the_allocations(team, fleet, api):
    from scheduler.transitions import job_transition

    resp = api(team["member"]).post(
        "/api/v1/jobs", {"project": "alpha", "name": "x", "command": "true"}, format="json"
    )
    job = Job.objects.get(pk=resp.json()["id"])
    run_cycle()
    job.refresh_from_db()
    assert job.state in ACTIVE_STATES
    job_transition(job=job, to=JobState.CANCELLED, actor_label="test", reason="test")
    assert not Allocation.objects.filter(job=job, ended_at__isnull=True).exists()


def test_every_price_shown_is_what_billing_charges_once_a_new_price_is_published(
    team, fleet, api, client
):
    """The catalog's list price is where a model's price starts; once a price list is
    published, the pages, the API and the quotes show the published price, which billing
    charges."""
    from datetime import timedelta
    from decimal import Decimal

    from billing import services
    from billing.selectors import job_cost

    l4 = fleet["l4"]
    now = timezone.now()
    services.price_publish(
        actor=None, gpu_model=l4, effective_from=now, on_demand_per_gpu_hour=Decimal("2.3456")
    )
    assert l4.price_per_gpu_hour != Decimal("2.3456")  # the catalog still says the old one
    shown = "2.35"
    member = team["member"]
    client.force_login(member)
    catalog = client.get("/gpus/").content.decode()
    row = catalog[catalog.index("<strong>L4</strong>") :].split("</tr>")[0]
    assert f'<td class="num">{shown}</td>' in row
    models = {m["name"]: m for m in api(member).get("/api/v1/gpu-models/").json()}
    assert models["L4"]["price_per_gpu_hour"] == "2.3456"
    one = api(member).get("/api/v1/gpu-models/L4/").json()
    assert one["price_per_gpu_hour"] == "2.3456"
    for page in ("/", "/jobs/new/"):
        text = client.get(page).content.decode()
        row = text[text.index('gpu_model=L4"' if page == "/" else 'value="L4"') :].split("</tr>")[0]
        assert f'<td class="num">{shown}</td>' in row, page
    body = {"project": "alpha", "name": "x", "command": "true", "gpu_model": "L4", "gpus": 1}
    dry = api(member).post("/api/v1/jobs/dry-run", body, format="json").json()
    assert Decimal(dry["rate_per_gpu_hour"]) == Decimal("2.3456")
    job = Job.objects.get(pk=api(member).post("/api/v1/jobs", body, format="json").json()["id"])
    run_cycle()
    started = Allocation.objects.get(job=job).started_at.replace(microsecond=0)
    billed = job_cost(job, now=started + timedelta(hours=1))
    assert Decimal(dry["cost_per_hour"]) == billed  # a whole GPU of a time-sliced ×2 L4


def test_the_models_a_job_may_land_on_are_the_same_for_the_quote_billing_and_the_planner(
    team, fleet, api
):
    """L4 or H100, with at least 40 GB: only the H100 may take it. The dry run and the job
    page quote the H100 alone (no range), billing's hard-cap check reckons with the H100,
    and the planner places it there."""
    from billing.admission import expected_cost
    from scheduler.admission import JobSpec, job_submit
    from scheduler.estimates import job_dry_run, job_hourly_cost, rates_now

    h100 = fleet["h100"]
    spec = JobSpec(
        name="x", command="true", gpu_models=("L4", "H100-80GB-SXM"), min_gpu_memory_gb=40
    )
    dry = job_dry_run(project=team["a"], spec=spec)
    assert dry.cost_per_hour_most is None
    assert dry.rate_per_gpu_hour == rates_now([h100])[h100.pk]
    assert "× H100-80GB-SXM" in expected_cost(spec)[1]
    # nothing but L4s free: it waits rather than land on one, quoted on the H100 alone
    for name in ("h1", "h2"):
        Gpu.objects.filter(node=fleet["nodes"][name]).update(health=Gpu.Health.UNHEALTHY)
    (job,) = job_submit(actor=team["member"], project=team["a"], spec=spec)
    run_cycle()
    assert not Allocation.objects.filter(job=job).exists()
    assert job_hourly_cost(job).high is None
    assert job_hourly_cost(job).low == dry.cost_per_hour
    Gpu.objects.filter(node__in=[fleet["nodes"]["h1"], fleet["nodes"]["h2"]]).update(
        health=Gpu.Health.HEALTHY
    )
    run_cycle()
    assert Allocation.objects.get(job=job).gpu_model == h100


def test_fair_share_counts_gpu_hours_as_quotas_count_them(team, fleet):
    """A project's fair-share usage (undecayed: the allocation ends now) is the GPU-hours its
    quota counts: a whole-GPU share on a time-sliced ×2 L4 is half a GPU-hour an hour, and a
    running one counts the same."""
    from datetime import timedelta
    from decimal import Decimal

    from scheduler.cycle import reads as cycle_reads
    from scheduler.cycle.state import _decayed_usage
    from scheduler.selectors import project_gpu_hours

    project = team["a"]
    now = timezone.now().replace(microsecond=0)
    l4 = Gpu.objects.filter(model=fleet["l4"]).order_by("pk")
    job = Job.objects.create(
        project=project, submitted_by=team["member"], name="x", command="true", state="running"
    )
    for gpu, ended in ((l4[0], now), (l4[1], None)):  # one ended just now, one running
        Allocation.objects.create(
            job=job,
            gpu=gpu,
            node=gpu.node,
            attempt=1,
            share_milli=1000,
            gpu_model=fleet["l4"],
            started_at=now - timedelta(hours=2),
            ended_at=ended,
        )
    quota_hours = project_gpu_hours(project, since=now - timedelta(days=7), now=now)
    assert quota_hours == Decimal("2.00")  # 2 shares × 2 h × half a GPU
    usage = _decayed_usage({project.pk}, now, cycle_reads.ACTIVE_ALLOCATIONS.rows())
    assert usage[project.pk] == pytest.approx(float(quota_hours), rel=1e-6)
