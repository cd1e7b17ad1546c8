"""The embedded default (`make run`: SQLite, the file cache, no Redis) takes the generic paths.

Every fast path that needs PostgreSQL or Redis has a generic fallback for the embedded demo:
`foundation.db`'s bulk writes and compiled reads fall back to Django's ORM, the agent gate to
three cache calls, the throttle and locks to the Django cache API, the live telemetry store
to the cache. The main suite runs on PostgreSQL and Redis; this lane runs those fallbacks.
"""

from __future__ import annotations

from datetime import timedelta
from typing import NamedTuple

import pytest
from django.db.models import F
from django.utils import timezone
from rest_framework.test import APIClient

from foundation.db import (
    AnyOf,
    CompiledQuery,
    EpochSeconds,
    bulk_update_rows,
    insert_instances,
    insert_rows,
)
from foundation.locks import lock_clear, single_flight
from foundation.ratelimit import window_hit
from monitoring import live
from portal.models import Project
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Job, JobEvent, JobState

pytestmark = pytest.mark.django_db

SYNC = "/api/agent/v1/sync"


class SlugRow(NamedTuple):
    slug: str
    created_s: float


def test_compiled_reads_run_as_plain_querysets(make_project):
    for slug in ("a", "b", "c"):
        make_project(slug)
    query = CompiledQuery(
        lambda slugs: (
            Project.objects.filter(AnyOf(F("slug"), slugs))
            .order_by("slug")
            .values_list("slug", EpochSeconds("created_at"))
        ),
        row=SlugRow,
    )
    rows = query.rows(slugs=["a", "c", "zz"])
    assert [r.slug for r in rows] == ["a", "c"]
    now = timezone.now().timestamp()
    assert all(now - 60 < r.created_s <= now + 1 for r in rows)
    assert query.rows(slugs=[]) == []  # an empty list matches nothing, as on PostgreSQL


def test_bulk_writes_fall_back_to_the_orm(placed_job):
    job = placed_job
    now = timezone.now()
    assert (
        insert_rows(
            JobEvent,
            ["job", "created_at", "from_state", "to_state", "actor_label", "reason", "data"],
            [
                (job.pk, now, "queued", "queued", "test", "one", {}),
                (job.pk, now, "", "", "t", "two", {}),
            ],
        )
        == 2
    )
    assert list(
        JobEvent.objects.filter(job=job, actor_label__in=["test", "t"])
        .order_by("reason")
        .values_list("reason", flat=True)
    ) == ["one", "two"]
    # `skip_locked_where`: only rows still matching it are updated
    updated = bulk_update_rows(
        Job,
        ["pending_message"],
        [(job.pk, "not queued any more")],
        skip_locked_where={"state": JobState.QUEUED},
    )
    assert updated == 0
    assert bulk_update_rows(Job, ["pending_message"], [(job.pk, "hello")]) == 1
    job.refresh_from_db()
    assert job.pending_message == "hello"
    events = [JobEvent(job=job, to_state="running", reason=f"r{i}") for i in range(3)]
    insert_instances(events)
    assert all(e.pk is not None for e in events)
    assert JobEvent.objects.filter(pk__in=[e.pk for e in events]).count() == 3


def test_metering_writes_fall_back_to_the_orm(placed_job):
    """`usage_meter`'s plain-row writes (slices skipped on conflict, meters overwritten) and
    its array-parameter reads, on SQLite: twice over an ended allocation writes it once."""
    from billing.models import AllocationMeter, UsageRecord
    from billing.services import usage_meter

    alloc = Allocation.objects.get(job=placed_job)
    start = alloc.started_at.replace(minute=50, second=0, microsecond=0) - timedelta(hours=3)
    Allocation.objects.filter(pk=alloc.pk).update(
        started_at=start, ended_at=start + timedelta(minutes=15), end_reason="completed"
    )
    now = start + timedelta(hours=2)
    first = usage_meter(now=now, allocation_ids=[alloc.pk])
    assert (first.allocations, first.records) == (1, 2)  # :50 to :00, :00 to :05
    slices = list(UsageRecord.objects.filter(allocation=alloc).values_list("seconds", "amount"))
    assert sorted(s for s, _ in slices) == [300, 600] and all(a > 0 for _, a in slices)
    meter = AllocationMeter.objects.get(allocation=alloc)
    assert meter.done and meter.metered_until == start + timedelta(minutes=15)
    # the meter cursor set back (as if a crash lost it): slices are skipped, the meter rewritten
    AllocationMeter.objects.filter(allocation=alloc).update(metered_until=start, done=False)
    again = usage_meter(now=now, allocation_ids=[alloc.pk])
    assert again.records == 2
    assert UsageRecord.objects.filter(allocation=alloc).count() == 2
    assert AllocationMeter.objects.get(allocation=alloc).done


def test_locks_and_throttle_windows_use_the_cache():
    lock_clear("embedded-test")
    with single_flight("embedded-test", ttl=30) as held:
        assert held
        with single_flight("embedded-test", ttl=30) as again:
            assert not again
    with single_flight("embedded-test", ttl=30) as after:
        assert after
    hits = [window_hit("embedded-test-window", 60)[0] for _ in range(3)]
    assert hits == [hits[0], hits[0] + 1, hits[0] + 2]


def test_a_job_runs_end_to_end_on_the_embedded_default(team, fleet, api):
    """Submit, schedule, sync (the gate's fallback), start, heartbeat (live store in the cache)."""
    resp = api(team["member"]).post(
        "/api/v1/jobs",
        {"project": "alpha", "name": "e", "command": "true", "gpu_model": "H100-80GB-SXM"},
        format="json",
    )
    assert resp.status_code == 201, resp.content
    job = Job.objects.get(pk=resp.json()["id"])
    result = run_cycle()
    assert result.placed == [job.pk]
    alloc = Allocation.objects.get(job=job)
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {fleet['tokens'][alloc.node.name]}")
    first = agent.post(SYNC, {}, format="json").json()
    assert [a["job_id"] for a in first["assignments"]] == [job.pk]
    again = agent.post(SYNC, {"version": first["version"]}, format="json").json()
    assert again == {"unchanged": True, "version": first["version"], "results": []}
    started = {"kind": "started", "job_id": job.pk, "attempt": 1}
    answer = agent.post(SYNC, {"version": first["version"], "reports": [started]}, format="json")
    assert answer.json()["results"][0]["state"] == JobState.RUNNING
    beat = agent.post(
        "/api/agent/v1/heartbeat",
        {"telemetry": [{"uuid": alloc.gpu.uuid, "utilization": 75.0}], "running": []},
        format="json",
    )
    assert beat.status_code == 200, beat.content
    assert live.latest([alloc.gpu_id])[alloc.gpu_id]["utilization"] == 75.0
    # a stranger's token is refused by the fallback too
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION="Bearer " + "x" * 40)
    assert stranger.post(SYNC, {}, format="json").status_code == 401


@pytest.fixture
def placed_job(team, fleet, api):
    resp = api(team["member"]).post(
        "/api/v1/jobs",
        {"project": "alpha", "name": "p", "command": "true", "gpu_model": "H100-80GB-SXM"},
        format="json",
    )
    run_cycle(now=timezone.now() + timedelta(seconds=1))
    job = Job.objects.get(pk=resp.json()["id"])
    assert job.state == JobState.SCHEDULED
    return job
