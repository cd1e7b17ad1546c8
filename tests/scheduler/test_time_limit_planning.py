"""A job's time limit is the ceiling of its runtime estimate: the ETA, shortest-job-first and
EASY backfill plan with it when the job gave no estimate (or a longer one)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from scheduler.core.model import planned_runtime_s
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Job, JobState, Pool

pytestmark = pytest.mark.django_db


def submit(api, user, **fields) -> int:
    body = {
        "project": "alpha",
        "name": "j",
        "command": "true",
        "gpu_model": "H100-80GB-SXM",
        **fields,
    }
    resp = api(user).post("/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return int(resp.json()["id"])


@pytest.mark.parametrize(
    ("estimate", "limit", "planned"),
    [
        (None, None, None),
        (600, None, 600),
        (None, 3600, 3600),
        (600, 3600, 600),
        (9000, 3600, 3600),
    ],
)
def test_the_planned_runtime_is_the_estimate_capped_by_the_limit(estimate, limit, planned):
    assert planned_runtime_s(estimate, limit) == planned


def test_the_eta_of_a_waiting_job_comes_from_the_running_jobs_time_limits(team, fleet, api):
    for _ in range(2):  # both H100 nodes full, each until its job's limit
        submit(api, team["member"], gpus=2, time_limit_s=3600)
    run_cycle()
    waiting = submit(api, team["member"], gpus=2)
    run_cycle()
    job = Job.objects.get(pk=waiting)
    assert job.state == JobState.QUEUED
    started = Allocation.objects.exclude(job=job).order_by("started_at").first()
    assert started is not None and job.estimated_start_at is not None
    assert abs(job.estimated_start_at - (started.started_at + timedelta(hours=1))) < timedelta(
        seconds=5
    )


def test_shortest_job_first_orders_by_the_time_limit(team, fleet, api):
    Pool.objects.update(queue_policy="sjf")
    submit(api, team["member"], gpus=2)
    submit(api, team["member"], gpus=1)
    run_cycle()  # one H100 left
    long = submit(api, team["member"], time_limit_s=10 * 3600)
    short = submit(api, team["member"], time_limit_s=3600)
    run_cycle()
    assert Job.objects.get(pk=short).state == JobState.SCHEDULED
    assert Job.objects.get(pk=long).state == JobState.QUEUED


@pytest.mark.parametrize(("limit", "backfilled"), [(1800, True), (7200, False)])
def test_backfill_lets_in_a_job_whose_limit_ends_before_the_head_job_starts(
    team, fleet, api, limit, backfilled
):
    first = submit(api, team["member"], gpus=1, time_limit_s=3600)
    run_cycle()
    submit(api, team["member"], gpus=2, time_limit_s=10 * 3600)  # the other H100 node, whole
    run_cycle()
    node = Allocation.objects.get(job_id=first).node
    head = submit(api, team["member"], gpus=2)  # waits for `first`'s node, reserved for it
    small = submit(api, team["member"], gpus=1, time_limit_s=limit)
    run_cycle()
    assert Job.objects.get(pk=head).state == JobState.QUEUED
    job = Job.objects.get(pk=small)
    if backfilled:
        assert job.state == JobState.SCHEDULED
        assert Allocation.objects.get(job=job).node == node
    else:
        assert job.state == JobState.QUEUED
