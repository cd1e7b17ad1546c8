"""The cycle's apply step: write the plan in one transaction, and why each unplaced job waits.

`apply_plan` locks every GPU row a placement touches and re-checks capacity against the active
allocations it then sees, so no GPU is ever over-allocated, whatever runs concurrently.
A placement that no longer fits is dropped and retried on the next cycle.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

import scheduler.cycle.reads as reads
from foundation.db import bulk_update_rows, insert_rows
from scheduler import elastic, gangs
from scheduler.core.model import billed_share_milli, gpu_capacity_milli
from scheduler.core.plan import Plan
from scheduler.core.planning.decisions import Placement, Resize
from scheduler.core.reasons import PendingReason
from scheduler.cycle.state import CycleInput, from_ts
from scheduler.cycle.volumes import volumes_bind
from scheduler.models import STOPPABLE_STATES, Allocation, Gpu, Job, JobState, Node
from scheduler.transitions import job_transition, jobs_changed, jobs_transition_bulk


@dataclass(frozen=True, slots=True)
class _LockedGpu:
    node_id: int
    node_name: str
    usable: bool  # healthy, on a ready node that is not fenced
    model_id: int
    capacity_milli: int
    memory_mib: int


@dataclass
class CycleResult:
    placed: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    resized: list[int] = field(default_factory=list)
    # jobs the plan placed that apply could not: why they wait, (reason, message)
    waiting: dict[int, tuple[str, str]] = field(default_factory=dict)
    pending: int = 0
    seconds: float = 0.0


def apply_plan(decided: Plan, state: CycleInput, *, now: datetime) -> CycleResult:
    """Write the plan's placements and preemptions; drop a placement that no longer fits.

    Plain rows throughout (a big cycle places hundreds of jobs on thousands of GPUs): the
    allocations and the JobEvents go in as one multi-row INSERT each, the jobs in one UPDATE.
    A plan with neither (a blocked queue's usual cycle) opens no transaction.
    """
    if not decided.placements and not decided.preemptions and not decided.resizes:
        return CycleResult(pending=len(decided.pending))
    return _apply_plan_locked(
        decided,
        now=now,
        holds=state.holds,
        project_of=state.project_of,
        unbound=state.unbound_volumes,
    )


@transaction.atomic
def _apply_plan_locked(
    decided: Plan,
    *,
    now: datetime,
    holds: dict[int, list[elastic.Held]],
    project_of: dict[int, int],
    unbound: dict[int, list[tuple[int, str]]] | None = None,
) -> CycleResult:
    """The plan's writes in named steps: lock the GPUs, see what is on them now, take each
    placement that still fits, write them, then the resizes and the preemptions."""
    result = CycleResult(pending=len(decided.pending))
    touched = sorted({s.gpu_id for p in decided.placements for s in p.shares})
    locked = _lock_gpus(touched)
    use = _gpu_use(touched, locked, holds=holds, now=now)
    now = use.now
    placed = _take_placements(decided, locked, use, result, unbound or {})
    _write_placements(placed, now=now, project_of=project_of)
    for resize in decided.resizes:
        if elastic.resize_planned(resize, now=now):
            result.resized.append(resize.job_id)
    _write_preemptions(decided, now=now, result=result)
    return result


def _lock_gpus(touched: list[int]) -> dict[int, _LockedGpu]:
    """Step 1: lock the GPU rows in a fixed order (no deadlock between two cycles)."""
    locked: dict[int, _LockedGpu] = {}
    for g in reads.LOCK_GPUS.rows(gpu_ids=touched):
        locked[g.pk] = _LockedGpu(
            node_id=g.node_id,
            node_name=g.node_name,
            usable=g.health != Gpu.Health.UNHEALTHY
            and g.node_state == Node.State.READY
            and not g.node_fenced,
            model_id=g.model_id,
            capacity_milli=gpu_capacity_milli(g.sharing_mode, g.oversubscription),
            memory_mib=g.memory_mib,
        )
    return locked


@dataclass
class _GpuUse:
    """What is allocated on the locked GPUs now, and the instant the new allocations start."""

    used: dict[int, int]
    used_mem: dict[int, int]
    now: datetime


def _gpu_use(
    touched: list[int],
    locked: dict[int, _LockedGpu],
    *,
    holds: dict[int, list[elastic.Held]],
    now: datetime,
) -> _GpuUse:
    """Step 2: read what is allocated on the locked GPUs now, with the GPUs held for grows."""
    used: dict[int, int] = defaultdict(int)
    used_mem: dict[int, int] = defaultdict(int)
    # The cycle's `now` was read before its snapshot: a job that ended after that instant (and
    # so freed its GPU for this plan) must not overlap the allocation that follows it.
    ended_since = now
    for gpu_id, share, mem, ended_at in reads.ALLOCATIONS_ON_GPUS.rows(gpu_ids=touched, now=now):
        if ended_at is None:
            used[gpu_id] += share
            used_mem[gpu_id] += mem
        else:
            ended_since = max(ended_since, ended_at)
    for held in holds.values():  # held for grows in flight (only this cycle makes new ones)
        for h in held:
            if h.gpu_id in locked:
                used[h.gpu_id] += h.milli
                used_mem[h.gpu_id] += h.memory_mib
    return _GpuUse(used=used, used_mem=used_mem, now=ended_since)


@dataclass
class _Placed:
    """The placements taken, as the rows and events `_write_placements` writes."""

    allocations: list[tuple[Any, ...]] = field(default_factory=list)
    scheduled: list[tuple[Any, ...]] = field(default_factory=list)
    gang_nodes: list[tuple[int, int, list[tuple[int, int]]]] = field(default_factory=list)
    reasons: dict[int, str] = field(default_factory=dict)
    event_data: dict[int, dict[str, object]] = field(default_factory=dict)


_TAKEN_BEFORE_PLACED = (
    PendingReason.NO_CAPACITY.value,
    "Waiting for capacity: the GPUs planned for it were taken or became unusable "
    "before it could be placed; it is planned again on the current state",
)


def _take_placements(
    decided: Plan,
    locked: dict[int, _LockedGpu],
    use: _GpuUse,
    result: CycleResult,
    unbound: dict[int, list[tuple[int, str]]],
) -> _Placed:
    """Step 3: take each placement whose job is still queued and whose GPUs still fit it."""
    placing = {
        row.pk: row
        for row in reads.lock_queued_jobs(job_ids=[p.job_id for p in decided.placements])
    }
    # A shrink frees its GPUs only once the shrunk job has stopped: a placement on them waits
    # (with that reason) rather than being dropped and planned again unchanged next cycle.
    shrinking = {s.gpu_id: r for r in decided.resizes for s in r.release}
    placed = _Placed()
    for placement in decided.placements:
        job_id = placement.job_id
        row = placing.get(job_id)
        if row is None:
            result.dropped.append(job_id)
            continue
        waits_for = next(
            (shrinking[s.gpu_id] for s in placement.shares if s.gpu_id in shrinking), None
        )
        if waits_for is not None:
            result.waiting[job_id] = _waits_for_shrink(waits_for)
            continue
        if not _still_fits(placement, locked, use):
            result.dropped.append(job_id)
            result.waiting[job_id] = _TAKEN_BEFORE_PLACED
            continue
        if job_id in unbound and (
            why := volumes_bind(
                job_id, unbound[job_id], {locked[s.gpu_id].node_name for s in placement.shares}
            )
        ):
            result.dropped.append(job_id)
            result.waiting[job_id] = (PendingReason.NODE_CONSTRAINTS.value, f"Waiting: {why}")
            continue
        _take(placement, row, locked, use, placed)
        result.placed.append(job_id)
    return placed


def _waits_for_shrink(resize: Resize) -> tuple[str, str]:
    return (
        PendingReason.PREEMPTING.value,
        f"Starting soon: job {resize.job_id} is shrinking to {resize.gpus} GPUs "
        "to make room for it",
    )


def _still_fits(placement: Placement, locked: dict[int, _LockedGpu], use: _GpuUse) -> bool:
    """Whether every share of the placement fits its GPU as the GPU is now (locked)."""
    for s in placement.shares:
        gpu = locked.get(s.gpu_id)
        if (
            gpu is None
            or not gpu.usable
            or use.used[s.gpu_id] + s.milli > gpu.capacity_milli
            or use.used_mem[s.gpu_id] + s.memory_mib > gpu.memory_mib
        ):
            return False
    return True


def _take(
    placement: Placement,
    row: reads.LockedQueuedJobRow,
    locked: dict[int, _LockedGpu],
    use: _GpuUse,
    placed: _Placed,
) -> None:
    """One placement taken: its allocations, its gang's nodes, its job's row and event."""
    job_id = placement.job_id
    attempt = row.attempt + 1
    borrowed = row.borrowed or placement.borrowed
    for s in placement.shares:
        gpu = locked[s.gpu_id]
        use.used[s.gpu_id] += s.milli
        use.used_mem[s.gpu_id] += s.memory_mib
        placed.allocations.append(
            (
                job_id,
                s.gpu_id,
                gpu.node_id,
                attempt,
                s.milli,
                s.memory_mib,
                billed_share_milli(s.milli, gpu.capacity_milli, s.memory_mib, gpu.memory_mib),
                gpu.model_id,
                borrowed,
                use.now,
                None,
                "",
            )
        )
    per_node: dict[int, int] = {}
    for s in placement.shares:  # rank order: the order of the placement's nodes
        per_node[locked[s.gpu_id].node_id] = per_node.get(locked[s.gpu_id].node_id, 0) + 1
    placed.gang_nodes.append((job_id, attempt, list(per_node.items())))
    # a placed job no longer waits: clear its reason, position and estimate
    placed.scheduled.append((job_id, row.state, attempt, borrowed, "", "", None, None))
    nodes = sorted({locked[s.gpu_id].node_name for s in placement.shares})
    placed.reasons[job_id] = f"Placed on {', '.join(nodes)}" + (
        " (borrowed, preemptible)" if placement.borrowed else ""
    )
    placed.event_data[job_id] = {"gpus": [s.gpu_id for s in placement.shares], "attempt": attempt}


def _write_placements(placed: _Placed, *, now: datetime, project_of: dict[int, int]) -> None:
    """Step 4: the allocations in one INSERT, the gangs' members, the jobs to `scheduled`."""
    insert_rows(Allocation, Allocation.WRITTEN_FIELDS, placed.allocations)
    ports_of = gangs.members_create(placed.gang_nodes, now=now)
    jobs_transition_bulk(
        rows=[(*row, ports_of.get(row[0])) for row in placed.scheduled],
        to=JobState.SCHEDULED,
        reasons=placed.reasons,
        actor_label="scheduler",
        data=placed.event_data,
        update_fields=(
            "attempt",
            "borrowed",
            "pending_reason",
            "pending_message",
            "queue_position",
            "estimated_start_at",
            "rendezvous_port",
        ),
        nodes_of={job_id: [node for node, _ in nodes] for job_id, _, nodes in placed.gang_nodes},
        project_of=project_of,
    )


def _write_preemptions(decided: Plan, *, now: datetime, result: CycleResult) -> None:
    """Step 5: each victim still holding GPUs goes to `preempting`, with its grace deadline."""
    for preemption in decided.preemptions:
        victim = (
            Job.objects.select_for_update()
            .filter(
                pk=preemption.job_id,
                state__in=STOPPABLE_STATES,
            )
            .first()
        )
        if victim is None:
            continue
        victim.preempt_deadline = now + timedelta(seconds=victim.grace_seconds)
        job_transition(
            job=victim,
            to=JobState.PREEMPTING,
            reason=f"Preempted for job {preemption.for_job_id}: {preemption.reason}",
            actor_label="scheduler",
            data={"for_job": preemption.for_job_id},
            update_fields=("preempt_deadline",),
        )
        result.preempted.append(victim.pk)


def record_pending(
    decided: Plan,
    state: CycleInput,
    placed: set[int],
    waiting: dict[int, tuple[str, str]] | None = None,
) -> int:
    """Write why each unplaced job waits. Advisory, so it never waits for a lock: a job that
    another transaction holds right now keeps its old reason until the next cycle.

    `waiting`: jobs the plan placed and apply could not, with why (every waiting job has a
    reason, whatever became of its plan)."""
    changed: dict[int, tuple[str, str, int | None, datetime | None]] = {}
    for job_id, (reason, message) in (waiting or {}).items():
        old = state.pending_now.get(job_id)
        why: tuple[str, str, int | None, datetime | None] = (reason, message[:500], None, None)
        if old is not None and job_id not in placed and why != old:
            changed[job_id] = why
    for job_id, pending in decided.pending.items():
        old = state.pending_now.get(job_id)
        if old is None or job_id in placed:
            continue
        estimated = from_ts(pending.estimated_start) if pending.estimated_start else None
        new = (pending.reason.value, pending.message[:500], pending.position, estimated)
        if new != old:
            changed[job_id] = new
    if not changed:
        return 0
    # One statement: lock what is free and still queued (skipping rows held elsewhere), update it.
    updated = bulk_update_rows(
        Job,
        ["pending_reason", "pending_message", "queue_position", "estimated_start_at"],
        [(pk, *new) for pk, new in changed.items()],
        skip_locked_where={"state": JobState.QUEUED},
    )
    jobs_changed(
        list(changed), project_of=state.project_of
    )  # their pages and the queue (a skipped row: a spare refresh)
    return updated
