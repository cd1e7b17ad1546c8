"""The job state machine: one function performs every transition, checked against one table.

Every transition writes a JobEvent (who, when, why) in the same transaction.

Fast path: one job's transition locks its state and reads its open allocations' nodes with
compiled queries (`CompiledQuery`), since every exit an agent reports comes through here
(building and compiling them each time cost a job's three busy syncs 29.4 million
instructions against 26.3 compiled); measured by `bench.endpoint_cost`'s busy sync.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from foundation import push
from foundation.db import AnyOf, CompiledQuery, bulk_update_rows, insert_rows
from portal.errors import Conflict
from portal.models import User
from scheduler import ports
from scheduler.dispatch import assignments_changed, changes_assignments
from scheduler.gangs import members_end
from scheduler.job_notices import job_notices_after_commit, notice_kind
from scheduler.models import ACTIVE_STATES, Allocation, Job, JobEvent
from scheduler.models import JobState as S

TRANSITIONS: dict[str, frozenset[str]] = {
    S.PENDING: frozenset({S.QUEUED, S.REJECTED, S.CANCELLED}),
    S.QUEUED: frozenset({S.SCHEDULED, S.CANCELLED, S.FAILED}),
    S.SCHEDULED: frozenset(
        {S.STARTING, S.RUNNING, S.CANCELLED, S.PREEMPTING, S.LOST, S.FAILED, S.SUCCEEDED}
    ),
    S.STARTING: frozenset({S.RUNNING, S.FAILED, S.CANCELLED, S.PREEMPTING, S.LOST, S.SUCCEEDED}),
    S.RUNNING: frozenset(
        {S.SUCCEEDED, S.FAILED, S.CANCELLED, S.PREEMPTING, S.LOST, S.QUEUED}  # QUEUED: restart
    ),
    S.PREEMPTING: frozenset({S.QUEUED, S.SUCCEEDED, S.FAILED, S.CANCELLED, S.LOST}),
    S.LOST: frozenset({S.QUEUED, S.FAILED, S.CANCELLED}),
    S.SUCCEEDED: frozenset(),
    S.FAILED: frozenset({S.QUEUED}),  # an array's failed shard retried (array_retry_failed)
    S.CANCELLED: frozenset(),
    S.REJECTED: frozenset(),
}

# A job requeued through no fault of its own (preempted, or its node lost) keeps its place in
# the queue: its first queued time still orders it. A restart after its own failure goes last.
KEEPS_ITS_PLACE = frozenset({S.PREEMPTING, S.LOST})

# Leaving a state that holds GPUs for one that does not ends the job's allocations.
HOLDS_GPUS = frozenset(ACTIVE_STATES)
END_REASON_FOR: dict[str, str] = {
    S.SUCCEEDED: Allocation.EndReason.COMPLETED,
    S.FAILED: Allocation.EndReason.FAILED,
    S.CANCELLED: Allocation.EndReason.CANCELLED,
    S.QUEUED: Allocation.EndReason.PREEMPTED,
    S.LOST: Allocation.EndReason.NODE_LOST,
}


# Compiled once (`CompiledQuery`): every transition of one job runs these (an agent's exit
# report, a cancel); `bench.endpoint_cost`'s busy sync measures them.
_LOCK_STATE = CompiledQuery(
    lambda pk: Job.objects.select_for_update().filter(pk=pk).values_list("state")
)
_OPEN_ALLOCATION_NODES = CompiledQuery(
    lambda job_id: Allocation.objects.filter(job_id=job_id, ended_at__isnull=True).values_list(
        "node_id"
    )
)


def can_transition(from_state: str, to_state: str) -> bool:
    return to_state in TRANSITIONS.get(from_state, frozenset())


@transaction.atomic
def job_transition(
    *,
    job: Job,
    to: str,
    reason: str,
    actor: User | None = None,
    actor_label: str | None = None,
    data: dict[str, Any] | None = None,
    end_reason: str | None = None,
    update_fields: tuple[str, ...] = (),
) -> Job:
    """Move `job` (locked by the caller, or locked here) to state `to`, or raise Conflict.

    Extra attributes the caller set on `job` are saved when named in `update_fields`.
    """
    locked = _LOCK_STATE.rows(pk=job.pk)
    if not locked:
        raise Job.DoesNotExist(f"Job {job.pk} does not exist.")
    current = locked[0][0]
    if not can_transition(current, to):
        raise Conflict(
            f"Job {job.pk} is {current}; it cannot become {to}.", code="invalid_transition"
        )
    now = timezone.now()
    fields = {"state", "updated_at", *update_fields}
    job.state = to
    if to == S.QUEUED and not (current in KEEPS_ITS_PLACE and job.queued_at is not None):
        job.queued_at = now  # the queue orders by it: the back of the queue
        fields.add("queued_at")
    if current == S.PREEMPTING and to != S.PREEMPTING:
        # A resize in flight (and the GPUs held for it) ends with the stop, however it ends:
        # cancelled, its node lost, restarted at its new size.
        job.resize = {}
        fields.add("resize")
    if to == S.RUNNING and job.started_at is None:
        job.started_at = now
        fields.add("started_at")
    if to in (S.SUCCEEDED, S.FAILED, S.CANCELLED, S.REJECTED):
        job.finished_at = now
        job.pending_reason = job.pending_message = ""
        job.queue_position = None
        job.estimated_start_at = None
        fields |= {
            "finished_at",
            "pending_reason",
            "pending_message",
            "queue_position",
            "estimated_start_at",
        }
    job.save(update_fields=sorted(fields))
    releasing = current in HOLDS_GPUS and to not in HOLDS_GPUS
    nodes: list[int] = []  # of the job's open allocations, read once for both uses below
    if changes_assignments(current, to) or (releasing and ports.ALLOCATION_LISTENERS):
        nodes = [row[0] for row in _OPEN_ALLOCATION_NODES.rows(job_id=job.pk)]
    if changes_assignments(current, to):
        assignments_changed(nodes)
    if releasing:
        Allocation.objects.filter(job=job, ended_at__isnull=True).update(
            ended_at=now, end_reason=end_reason or END_REASON_FOR.get(to, "")
        )
        ports.allocations_changed(node_ids=set(nodes))
        if job.rendezvous_port is not None:  # a gang: members still running are stopped
            members_end(job.pk, job.attempt, lost=to == S.LOST, now=now)
    JobEvent.objects.create(
        job=job,
        from_state=current,
        to_state=to,
        actor=actor,
        actor_label=actor_label or (str(actor) if actor else "system"),
        reason=reason[:500],
        data=data or {},
    )
    kind = notice_kind(current, to)
    if kind is not None:
        job_notices_after_commit([(job.pk, kind, reason[:500])])
    push.jobs_changed([(job.pk, job.project_id)])  # after commit: its page and the queue
    return job


def jobs_transition_bulk(
    *,
    rows: Sequence[tuple[Any, ...]],
    to: str,
    reasons: Mapping[int, str],
    actor_label: str,
    data: Mapping[int, dict[str, Any]] | None = None,
    update_fields: Sequence[str] = (),
    now: datetime | None = None,
    end_reason: str | None = None,
    nodes_of: Mapping[int, Collection[int]] | None = None,
    project_of: Mapping[int, int] | None = None,
) -> int:
    """`job_transition` for many jobs at once (the scheduling cycle's placements, a Slurm sync
    pass's changes).

    `rows` are `(pk, current state, *values of update_fields)` for rows the caller has locked;
    every move is checked against the same table and every job gets its JobEvent. Plain rows
    and a few statements, whatever the count: no model instances. A move that leaves GPUs
    behind ends the jobs' open allocations (`end_reason`, or the target state's) in one
    statement; a move to a final state clears the wait fields and sets `finished_at`, as
    `job_transition` does.

    `nodes_of` (each job's nodes) and `project_of` (its project), from a caller that knows
    them for every row (the cycle, which has just placed the jobs), spare reading them back.
    """
    if not rows:
        return 0
    now = now or timezone.now()
    fields, extra = _bulk_fields(to, update_fields, now=now)
    moves = _bulk_moves(rows, to, now=now, extra=extra)
    moves.events = [
        (
            pk,
            now,
            current,
            to,
            None,
            actor_label,
            reasons.get(pk, "")[:500],
            (data or {}).get(pk, {}),
        )
        for pk, current, *_ in rows
    ]
    updated = bulk_update_rows(Job, fields, moves.updates)
    insert_rows(JobEvent, JOB_EVENT_FIELDS, moves.events)
    job_notices_after_commit(
        [(e[0], kind, e[6]) for e in moves.events if (kind := notice_kind(e[2], to)) is not None]
    )
    pairs = _nodes_of_moves(moves, nodes_of)
    if moves.released:
        Allocation.objects.filter(AnyOf(F("job_id"), moves.released), ended_at__isnull=True).update(
            ended_at=now, end_reason=end_reason or END_REASON_FOR.get(to, "")
        )
    if pairs:
        moved, changed = set(moves.on_nodes), {*moves.placed, *moves.released}
        assignments_changed({node for job, node in pairs if job in moved})
        if changed:
            ports.allocations_changed(node_ids={node for job, node in pairs if job in changed})
    jobs_changed([row[0] for row in rows], project_of=project_of)
    return updated


def _bulk_fields(
    to: str, update_fields: Sequence[str], *, now: datetime
) -> tuple[list[str], tuple[Any, ...]]:
    """The columns a bulk move writes, and the values it adds after the caller's (`queued_at`;
    a final state's `finished_at` and cleared wait fields, unless the caller writes them)."""
    fields = ["state", "updated_at", *update_fields]
    extra: tuple[Any, ...] = ()
    if to == S.QUEUED:
        fields.append("queued_at")
        extra = (now,)
    if to in (S.SUCCEEDED, S.FAILED, S.CANCELLED, S.REJECTED):
        final: dict[str, Any] = {
            "finished_at": now,
            "pending_reason": "",
            "pending_message": "",
            "queue_position": None,
            "estimated_start_at": None,
        }
        fields += [f for f in final if f not in update_fields]
        extra = tuple(v for f, v in final.items() if f not in update_fields)
    return fields, extra


@dataclass
class _BulkMoves:
    """A bulk move's rows to write, and the jobs whose nodes it concerns."""

    updates: list[tuple[Any, ...]] = field(default_factory=list)
    events: list[tuple[Any, ...]] = field(default_factory=list)
    placed: list[int] = field(
        default_factory=list
    )  # now hold GPUs: their nodes' allocations changed
    on_nodes: list[int] = field(default_factory=list)  # change what their nodes run or stop
    released: list[int] = field(default_factory=list)  # leave their GPUs behind


def _bulk_moves(
    rows: Sequence[tuple[Any, ...]], to: str, *, now: datetime, extra: tuple[Any, ...]
) -> _BulkMoves:
    """Each move checked against the transition table, with its job's row to write."""
    moves = _BulkMoves()
    for pk, current, *values in rows:
        if not can_transition(current, to):
            raise Conflict(
                f"Job {pk} is {current}; it cannot become {to}.", code="invalid_transition"
            )
        if current in HOLDS_GPUS and to not in HOLDS_GPUS:
            moves.released.append(pk)
        moves.updates.append((pk, to, now, *values, *extra))
        if changes_assignments(current, to):
            moves.on_nodes.append(pk)
        if current not in HOLDS_GPUS and to in HOLDS_GPUS:
            moves.placed.append(pk)
    return moves


def _nodes_of_moves(
    moves: _BulkMoves, nodes_of: Mapping[int, Collection[int]] | None
) -> list[tuple[int, int]]:
    """(job, node) for the jobs whose nodes are told: from the caller, else one read of their
    open allocations, only where some node or allocation listener needs them."""
    concerned = {*moves.on_nodes, *moves.placed, *moves.released}
    if nodes_of is not None:
        return [(job, node) for job in concerned for node in nodes_of[job]]
    if moves.on_nodes or ((moves.placed or moves.released) and ports.ALLOCATION_LISTENERS):
        # the caller created the placed jobs' allocations before this call
        return list(
            Allocation.objects.filter(
                AnyOf(F("job_id"), [*concerned]),
                ended_at__isnull=True,
            ).values_list("job_id", "node_id")
        )
    return []


def jobs_changed(job_ids: Sequence[int], *, project_of: Mapping[int, int] | None = None) -> None:
    """Tell the pages of these jobs and their projects' queues, after commit (`foundation.push`).
    One read of the jobs' projects (unless `project_of` has them), made only where pushed
    updates are on."""
    if not job_ids or not push.enabled():
        return
    if project_of is not None:
        push.jobs_changed([(pk, project_of[pk]) for pk in job_ids])
        return
    push.jobs_changed(
        Job.objects.filter(AnyOf(F("pk"), list(job_ids))).values_list("pk", "project_id")
    )


JOB_EVENT_FIELDS = (
    "job",
    "created_at",
    "from_state",
    "to_state",
    "actor",
    "actor_label",
    "reason",
    "data",
)
