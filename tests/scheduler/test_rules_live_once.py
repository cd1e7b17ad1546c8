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
