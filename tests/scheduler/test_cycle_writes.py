"""What one cycle writes: allocations, transitions with their events, and pending reasons
(rewritten only where they changed, never for a row another transaction holds)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from foundation.db import bulk_update_rows, insert_rows
from scheduler.admission import JobSpec, job_cancel, job_submit
from scheduler.core.plan import plan
from scheduler.cycle import apply_plan, build_state, policy_config, record_pending, ts
from scheduler.models import Allocation, Gpu, Job, JobEvent, JobState
from tests.scheduler.test_concurrency import max_concurrent_share


@pytest.fixture
def lab(team, fleet):
    return {**team, **fleet}


def queue(lab, n: int, **spec) -> list[Job]:
    jobs = []
    for i in range(n):
        spec_i = JobSpec(name=f"j{i}", command="true", **spec)
        jobs += job_submit(actor=lab["member"], project=lab["a"], spec=spec_i)
    return jobs


def cycle(now):
    """One cycle as `run_cycle` does it, returning how many pending rows were written."""
    state = build_state(now=now)
    decided = plan(state.snapshot, state.queue, policy_config(), ts(now))
    result = apply_plan(decided, state, now=now)
    return result, record_pending(decided, state, set(result.placed))


def columns(jobs: list[Job]) -> dict[int, tuple[object, ...]]:
    rows = Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list(
        "pk", "pending_reason", "pending_message", "queue_position", "estimated_start_at"
    )
    return {pk: tuple(rest) for pk, *rest in rows}


@pytest.mark.django_db
def test_placements_write_allocations_events_and_clear_reasons(lab):
    running = queue(lab, 8, runtime_estimate_s=7200)  # fills the 8 GPUs
    now = timezone.now()
    submitted = {r.job_id: r.submitted_at for r in build_state(now=now).queue}
    assert submitted == {j.pk: pytest.approx(j.queued_at.timestamp(), abs=1e-6) for j in running}
    result, _ = cycle(now)
    assert sorted(result.placed) == sorted(j.pk for j in running)
    for job in Job.objects.filter(pk__in=result.placed):
        assert job.state == JobState.SCHEDULED and job.attempt == 1
        assert (job.pending_reason, job.pending_message) == ("", "")
        assert job.queue_position is None and job.estimated_start_at is None
        allocs = list(Allocation.objects.filter(job=job))
        assert len(allocs) == 1 and allocs[0].ended_at is None
        assert now <= allocs[0].started_at <= timezone.now()
        assert allocs[0].attempt == 1 and allocs[0].end_reason == ""
        gpu = allocs[0].gpu
        assert (allocs[0].node_id, allocs[0].gpu_model_id) == (gpu.node_id, gpu.model_id)
        assert allocs[0].share_milli == gpu.capacity_milli
        event = JobEvent.objects.get(job=job, to_state=JobState.SCHEDULED)
        assert event.from_state == JobState.QUEUED and event.actor_label == "scheduler"
        assert event.reason.startswith("Placed on ") and event.created_at is not None
        assert event.data == {"gpus": [gpu.pk], "attempt": 1}
    # every GPU holds exactly its capacity
    for gpu in Gpu.objects.all():
        held = sum(a.share_milli for a in gpu.allocations.filter(ended_at__isnull=True))
        assert held == gpu.capacity_milli
    # the next snapshot sees the work as running since its allocations started
    started = {w.job_id: w.started_at for w in build_state(now=now).snapshot.running}
    assert started == {
        a.job_id: pytest.approx(a.started_at.timestamp(), abs=1e-6)
        for a in Allocation.objects.filter(job_id__in=result.placed)
    }


@pytest.mark.django_db
def test_an_allocation_starts_after_the_one_that_freed_its_gpu_ended(lab):
    """The cycle's clock is read before its snapshot; a job that ended between that instant and
    the snapshot freed its GPU, and the new allocation must not start before that end."""
    first = queue(lab, 8, runtime_estimate_s=7200)
    cycle(timezone.now())
    cycle_began = timezone.now()
    job_cancel(actor=lab["member"], job=first[0])  # ends its allocation after cycle_began
    freed = Allocation.objects.get(job=first[0])
    late = queue(lab, 1)
    result, _ = cycle(cycle_began)
    assert result.placed == [late[0].pk]
    new = Allocation.objects.get(job=late[0])
    assert new.gpu_id == freed.gpu_id and new.started_at >= freed.ended_at > cycle_began
    assert max_concurrent_share(list(Allocation.objects.filter(gpu_id=new.gpu_id))) == {
        new.gpu_id: 1000
    }


def test_apply_drops_a_placement_whose_gpu_was_taken_meanwhile(lab):
    [job] = queue(lab, 1)
    now = timezone.now()
    state = build_state(now=now)
    decided = plan(state.snapshot, state.queue, policy_config(), ts(now))
    [placement] = decided.placements
    other = queue(lab, 1)[0]
    gpu = Gpu.objects.get(pk=placement.shares[0].gpu_id)
    Allocation.objects.create(  # a concurrent cycle got there first
        job=other,
        gpu=gpu,
        node=gpu.node,
        attempt=1,
        share_milli=gpu.capacity_milli,
        gpu_model=gpu.model,
        started_at=now,
    )
    result = apply_plan(decided, state, now=now)
    assert result.dropped == [job.pk] and not result.placed
    assert Job.objects.get(pk=job.pk).state == JobState.QUEUED
    assert gpu.allocations.filter(ended_at__isnull=True).count() == 1


@pytest.mark.django_db
def test_waiting_jobs_get_reasons_once_and_only_changes_are_rewritten(lab):
    queue(lab, 8, runtime_estimate_s=7200)
    waiting = queue(lab, 4, runtime_estimate_s=600)
    now = timezone.now()
    _, written = cycle(now)
    assert written == len(waiting)
    first = columns(waiting)
    assert [first[j.pk][2] for j in waiting] == [1, 2, 3, 4]  # queue positions, in order
    for reason, message, _position, estimated in first.values():
        assert reason and message
        assert estimated == pytest.approx(now + timedelta(seconds=7200), abs=timedelta(seconds=1))

    # nothing changed: nothing is written, and what is shown is still right
    _, written = cycle(now + timedelta(seconds=1))
    assert written == 0
    assert columns(waiting) == first

    # the head of the queue leaves: the others move up, and only they are rewritten
    job_cancel(actor=lab["member"], job=waiting[0])
    _, written = cycle(now + timedelta(seconds=2))
    assert written == 3
    after = columns(waiting)
    assert after[waiting[0].pk] == ("", "", None, None)
    assert [after[j.pk][2] for j in waiting[1:]] == [1, 2, 3]
    assert "no job ahead" in after[waiting[1].pk][1]


@pytest.mark.django_db(transaction=True)
def test_pending_reason_of_a_row_held_elsewhere_waits_for_the_next_cycle(lab):
    queue(lab, 8, runtime_estimate_s=7200)
    waiting = queue(lab, 3, runtime_estimate_s=600)
    now = timezone.now()
    cycle(now)
    job_cancel(actor=lab["member"], job=waiting[0])
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        try:
            with transaction.atomic():
                Job.objects.select_for_update().get(pk=waiting[2].pk)
                held.set()
                release.wait(10)
        finally:
            connection.close()

    thread = threading.Thread(target=holder)
    thread.start()
    try:
        assert held.wait(10)
        _, written = cycle(now + timedelta(seconds=1))  # does not wait for the lock
    finally:
        release.set()
        thread.join()
    assert written == 1
    positions = {pk: c[2] for pk, c in columns(waiting[1:]).items()}
    assert positions == {waiting[1].pk: 1, waiting[2].pk: 3}  # the held row is stale
    _, written = cycle(now + timedelta(seconds=2))
    assert written == 1
    assert columns([waiting[2]])[waiting[2].pk][2] == 2


@pytest.mark.django_db
def test_row_helpers_round_trip_every_column_type(lab):
    [job] = queue(lab, 1)
    now = timezone.now()
    inserted = insert_rows(
        JobEvent,
        ("job", "created_at", "from_state", "to_state", "actor", "actor_label", "reason", "data"),
        [
            (job.pk, now, "queued", "queued", None, "test", 'it\'s "quoted"', {"a": [1, "x"]}),
            (job.pk, now, "", "queued", lab["member"].pk, "test", "", {}),
        ],
    )
    assert inserted == 2
    events = list(JobEvent.objects.filter(job=job, actor_label="test").order_by("pk"))
    assert [(e.reason, e.data, e.actor_id, e.created_at) for e in events] == [
        ('it\'s "quoted"', {"a": [1, "x"]}, None, now),
        ("", {}, lab["member"].pk, now),
    ]
    fields = ["pending_reason", "queue_position", "estimated_start_at", "borrowed"]
    assert bulk_update_rows(Job, fields, [(job.pk, "quota", 7, now, True)]) == 1
    job.refresh_from_db()
    assert (job.pending_reason, job.queue_position, job.estimated_start_at, job.borrowed) == (
        "quota",
        7,
        now,
        True,
    )
    # a guard that no longer matches leaves the row alone
    Job.objects.filter(pk=job.pk).update(state=JobState.CANCELLED)
    rows = [(job.pk, "", None, None, False)]
    assert bulk_update_rows(Job, fields, rows, skip_locked_where={"state": "queued"}) == 0
    job.refresh_from_db()
    assert job.queue_position == 7
