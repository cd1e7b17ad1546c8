"""Slurm's job states and pending reasons → ours, in words; the periodic sync pass.

`translate` is the table: one Slurm state (and reason) → our state and the words the job page
shows ("waiting: Resources — …", "timeout: …", "out of memory", "node failure", "preempted and
requeued"). `sync_pool` reads the queue once (`squeue --json`), asks `sacct` about the linked
jobs the queue no longer shows, and moves each of our jobs along the transition table, with
allocations on the mirrored GPUs while Slurm runs it (Slurm's own start and end times).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from foundation.db import bulk_update_rows
from scheduler.backends.slurm.client import SlurmError, cluster_for
from scheduler.backends.slurm.models import SlurmJob
from scheduler.backends.slurm.nodes import hostlist, mirror_name, parse_indexes, sync_nodes
from scheduler.models import (
    ACTIVE_STATES,
    STOPPABLE_STATES,
    Allocation,
    Gpu,
    Job,
    JobEvent,
    JobState,
    Pool,
)
from scheduler.transitions import TRANSITIONS, jobs_transition_bulk

S = JobState
ACTOR = "slurm"

# Why a job waits, in words (Slurm's reason code stays in front: operators search for it).
REASONS: dict[str, str] = {
    "Resources": "the GPUs it asks for are in use",
    "Priority": "jobs of higher priority go first",
    "Dependency": "waiting for the jobs it depends on",
    "DependencyNeverSatisfied": "a job it depends on failed; it will never start",
    "BeginTime": "its start time has not come (a requeued job waits a moment)",
    "JobHeldUser": "held by its user",
    "JobHeldAdmin": "held by an administrator",
    "QOSMaxGRESPerUser": "the QOS's GPU limit per user is reached",
    "QOSGrpGRES": "the QOS's GPU limit is reached",
    "AssocGrpGRES": "the project's GPU limit in Slurm is reached",
    "AssocMaxGRESPerJob": "more GPUs than the project may use in one job",
    "AssocGrpGRESRunMinutes": "the project's running GPU-minutes limit in Slurm is reached",
    "QOSMaxWallDurationPerJobLimit": "its time limit is above what the QOS allows",
    "PartitionTimeLimit": "its time limit is above the partition's",
    "PartitionDown": "the partition is down",
    "ReqNodeNotAvail": "the nodes it needs are not available (drained or down)",
    "NodeDown": "a node it needs is down",
    "BadConstraints": "no node can ever satisfy it",
    "InvalidAccount": "the project has no Slurm account",
    "InvalidQOS": "its QOS is not allowed for the project",
    "Reservation": "waiting for a reservation",
    "None": "not yet considered by Slurm's scheduler",
}


@dataclass(frozen=True)
class Translation:
    state: str  # ours
    words: str  # pending message or failure reason
    requeued: bool = False


# Slurm state → our state and words; PENDING's words come from the reason.
STATES: dict[str, tuple[str, str]] = {
    "PENDING": (S.QUEUED, "waiting"),
    "REQUEUED": (S.QUEUED, "preempted and requeued"),
    "REQUEUE_HOLD": (S.QUEUED, "requeued and held"),
    "REQUEUE_FED": (S.QUEUED, "requeued"),
    "CONFIGURING": (S.STARTING, "starting: nodes are being configured"),
    "RUNNING": (S.RUNNING, ""),
    "COMPLETING": (S.RUNNING, "completing"),
    "STAGE_OUT": (S.RUNNING, "staging out"),
    "SIGNALING": (S.RUNNING, ""),
    "RESIZING": (S.RUNNING, ""),
    "SUSPENDED": (S.PREEMPTING, "suspended by Slurm"),
    "STOPPED": (S.PREEMPTING, "stopped by Slurm"),
    "COMPLETED": (S.SUCCEEDED, ""),
    "FAILED": (S.FAILED, "failed"),
    "TIMEOUT": (S.FAILED, "timeout: it ran into its time limit"),
    "OUT_OF_MEMORY": (S.FAILED, "out of memory: Slurm stopped it at its memory limit"),
    "NODE_FAIL": (S.FAILED, "node failure: a node it ran on failed"),
    "BOOT_FAIL": (S.FAILED, "node failure: a node failed to boot for it"),
    "DEADLINE": (S.FAILED, "its deadline passed before it could run"),
    "CANCELLED": (S.CANCELLED, "cancelled in Slurm"),
    "PREEMPTED": (S.FAILED, "preempted by Slurm (not requeued)"),
    "REVOKED": (S.CANCELLED, "revoked by Slurm (federation)"),
    "SPECIAL_EXIT": (S.FAILED, "special exit"),
}


def translate(
    state: str, reason: str = "", *, restarts: int = 0, exit_code: int | None = None
) -> Translation:
    """Slurm's words for a job → ours (the mapping the tests go through one row at a time)."""
    base = (state or "").split()[0].upper() if state else "PENDING"
    ours, words = STATES.get(base, (S.QUEUED, f"Slurm state {base}"))
    reason = reason or "None"
    if ours == S.QUEUED and base == "PENDING":
        if restarts:
            return Translation(
                S.QUEUED,
                f"preempted and requeued (restart {restarts}); "
                f"waiting: {reason} — {REASONS.get(reason, reason)}",
                True,
            )
        return Translation(S.QUEUED, f"waiting: {reason} — {REASONS.get(reason, reason)}")
    if base == "FAILED" and exit_code not in (None, 0):
        words = f"failed: exit code {exit_code}"
    if base == "CANCELLED" and reason not in ("None", ""):
        words = f"cancelled in Slurm ({reason})"
    return Translation(ours, words, ours == S.QUEUED)


_PREFERRED: list[str] = [
    S.SCHEDULED,
    S.PREEMPTING,  # before running: a job Slurm requeued before it ran never ran
    S.RUNNING,
    S.QUEUED,
    S.SUCCEEDED,
    S.FAILED,
    S.CANCELLED,
]


def path(current: str, target: str) -> list[str]:
    """The shortest legal way from our state to the target (e.g. queued → scheduled → running)."""
    if current == target:
        return []
    seen, todo = {current: [current]}, deque([current])
    while todo:
        here = todo.popleft()
        for nxt in sorted(
            TRANSITIONS.get(here, frozenset()),
            key=lambda s: _PREFERRED.index(s) if s in _PREFERRED else 99,
        ):
            if nxt not in seen:
                seen[nxt] = [*seen[here], nxt]
                if nxt == target:
                    return seen[nxt][1:]
                todo.append(nxt)
    return []


def _when(value: Any) -> datetime | None:
    if not value or not isinstance(value, int):
        return None
    return datetime.fromtimestamp(value, tz=UTC)


def _expand(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """squeue's records by our key: '1234', or '1234_5' for array tasks (a pending array's
    collapsed record '1234_[0-3]' is expanded to each task)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        array_id = r.get("array_job_id") or 0
        task = r.get("array_task_id")
        if array_id and task is not None:
            out[f"{array_id}_{task}"] = r
        elif array_id and r.get("array_task_string"):
            spec = str(r["array_task_string"]).split("%")[0]
            for idx in parse_indexes(f"IDX:{spec}"):
                out.setdefault(f"{array_id}_{idx}", r)
        else:
            out[str(r["job_id"])] = r
    return out


def _sacct_by_key(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        arr = r.get("array") or {}
        key = (
            f"{arr['job_id']}_{arr['task_id']}"
            if arr.get("job_id") and arr.get("task_id") is not None
            else str(r["job_id"])
        )
        prev = out.get(key)
        if prev is None or (r.get("time", {}).get("submission") or 0) >= (
            prev.get("time", {}).get("submission") or 0
        ):
            out[key] = r  # the latest run of a requeued job
    return out


def _from_sacct(r: dict[str, Any]) -> dict[str, Any]:
    """A sacct record in squeue's shape (the fields `apply` reads)."""
    t = r.get("time", {})
    ec = (r.get("exit_code") or {}).get("return_code")
    return {
        "job_state": (r.get("state") or {}).get("current", ""),
        "state_reason": (r.get("state") or {}).get("reason", ""),
        "start_time": t.get("start"),
        "end_time": t.get("end"),
        "exit_code": ec,
        "nodes": r.get("nodes", ""),
        "restart_cnt": None,
        "gres_detail": [],
    }


def sync_pool(pool: Pool) -> dict[str, int]:
    """One pass for one Slurm pool. Returns counts (seen, moved)."""
    cfg = pool.slurm
    cluster = cluster_for(pool)
    sync_nodes(pool)
    links = list(
        SlurmJob.objects.filter(pool=pool)
        .exclude(job__state__in=[S.SUCCEEDED, S.FAILED, S.CANCELLED, S.REJECTED])
        .select_related("job")
    )
    if not links:
        cfg.last_sync_at = timezone.now()
        cfg.save(update_fields=["last_sync_at"])
        return {"seen": 0, "moved": 0}
    queue = _expand(cluster.squeue())
    missing = [link.slurm_job_id for link in links if link.slurm_job_id not in queue]
    done: dict[str, dict[str, Any]] = {}
    if missing:
        since = min(link.submitted_at for link in links) - timedelta(minutes=1)
        start = since.strftime("%Y-%m-%dT%H:%M:%S")
        end = (timezone.now() + timedelta(minutes=1)).strftime("%Y-%m-%dT%H:%M:%S")
        ids = sorted({m.split("_")[0] for m in missing})
        try:
            done = {
                k: _from_sacct(v)
                for k, v in _sacct_by_key(cluster.sacct(start=start, end=end, job_ids=ids)).items()
            }
        except SlurmError:
            done = {}
    changes = [
        (link, record)
        for link in links
        if (record := queue.get(link.slurm_job_id) or done.get(link.slurm_job_id)) is not None
        # a waiting job Slurm says the same of costs no lock and no write
        and not _unchanged(link, record)
    ]
    moved = apply_all(pool, changes)
    cfg.last_sync_at = timezone.now()
    cfg.last_error = ""
    cfg.save(update_fields=["last_sync_at", "last_error"])
    return {"seen": len(links), "moved": moved}


class _Mirror:
    """The pool's mirrored nodes and their GPUs, read once per pass (when a job starts)."""

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self._gpus: dict[str, dict[int, Gpu]] | None = None

    def gpus(self, record: dict[str, Any], count_hint: int) -> list[Gpu]:
        """The mirrored GPUs Slurm gave the job (squeue's gres_detail per node, in node order)."""
        from scheduler.backends.slurm.nodes import parse_gres

        if self._gpus is None:
            self._gpus = {}
            prefix = mirror_name(self.pool, "")
            for gpu in Gpu.objects.filter(node__name__startswith=prefix).select_related("node"):
                self._gpus.setdefault(gpu.node.name, {})[gpu.index] = gpu
        names = hostlist(record.get("nodes") or "")
        details = record.get("gres_detail") or []
        gpus: list[Gpu] = []
        for i, name in enumerate(names):
            on_node = self._gpus.get(mirror_name(self.pool, name))
            if on_node is None:
                continue
            detail = details[i] if i < len(details) else ""
            idx = parse_indexes(detail)
            if not idx:
                per_node = sum(c for _, c in parse_gres(detail)) or max(1, count_hint // len(names))
                idx = list(range(per_node))
            gpus.extend(on_node[x] for x in sorted(set(idx)) if x in on_node)
        return gpus


def _unchanged(link: SlurmJob, record: dict[str, Any]) -> bool:
    return (
        link.seen_at is not None
        and link.state == str(record.get("job_state", ""))[:32]
        and link.reason == str(record.get("state_reason", ""))[:64]
        and link.nodes == str(record.get("nodes") or "")[:500]
        and int(record.get("restart_cnt") or 0) <= link.restarts
    )


@dataclass
class _Change:
    job: Job
    link: SlurmJob
    record: dict[str, Any]
    t: Translation
    restarts: int
    exit_code: Any
    start: datetime | None
    end: datetime | None
    steps: list[str]
    before: str


CHUNK = 500  # changes per transaction: a burst of thousands holds no lock for long


def apply_all(pool: Pool, changes: list[tuple[SlurmJob, dict[str, Any]]]) -> int:
    """Bring our jobs to what Slurm says; returns how many changed state.

    One pass's changes go together: one lock statement for all of them, then each step of the
    transition table (queued → scheduled → running → succeeded) for every job that takes it as
    one bulk transition with its events, the allocations of the jobs Slurm started in one
    insert, and the links, Slurm's end times and the pending messages in one update each: a
    fixed number of statements per pass, not ~20 per job (issue 17's burst latency).
    """
    moved = 0
    for i in range(0, len(changes), CHUNK):
        moved += _apply_chunk(pool, changes[i : i + CHUNK])
    return moved


def apply(link: SlurmJob, record: dict[str, Any]) -> bool:
    """Bring one job to what Slurm says. True when our state changed."""
    return apply_all(link.pool, [(link, record)]) > 0


def _plan(job: Job, link: SlurmJob, record: dict[str, Any], now: datetime) -> _Change:
    restarts = int(record.get("restart_cnt") or 0)
    exit_code = record.get("exit_code")
    t = translate(
        str(record.get("job_state", "")),
        str(record.get("state_reason", "")),
        restarts=restarts,
        exit_code=exit_code if isinstance(exit_code, int) else None,
    )
    link.state = str(record.get("job_state", ""))[:32]
    link.reason = str(record.get("state_reason", ""))[:64]
    link.nodes = str(record.get("nodes") or "")[:500]
    link.seen_at = now
    requeued = restarts > link.restarts
    link.restarts = max(link.restarts, restarts)
    steps = path(job.state, t.state)
    if requeued and job.state in STOPPABLE_STATES:
        # Slurm requeued it (preempted) since the last pass: the old run ends here, even when
        # the new one already runs
        steps = path(job.state, S.QUEUED) + path(S.QUEUED, t.state)
    return _Change(
        job,
        link,
        record,
        t,
        restarts,
        exit_code,
        _when(record.get("start_time")),
        _when(record.get("end_time")),
        steps,
        job.state,
    )


# The fields a step sets besides the state (as the one-job `apply` always did).
FIELDS_FOR: dict[str, tuple[str, ...]] = {
    S.SCHEDULED: ("attempt",),
    S.RUNNING: ("started_at",),
    S.FAILED: ("failure_reason",),
    S.CANCELLED: ("failure_reason",),
    S.SUCCEEDED: ("exit_code",),
    S.QUEUED: ("restarts",),
}


def _step_values(c: _Change, to: str, now: datetime) -> tuple[Any, ...]:
    """The values of `FIELDS_FOR[to]` for this job (set on the job too)."""
    job = c.job
    if to == S.SCHEDULED:
        job.attempt = c.restarts + 1
        return (job.attempt,)
    if to == S.RUNNING:
        job.started_at = job.started_at or c.start or now
        return (job.started_at,)
    if to in (S.FAILED, S.CANCELLED):
        job.failure_reason = c.t.words[:500] if c.t.words else job.failure_reason
        return (job.failure_reason,)
    if to == S.SUCCEEDED:
        job.exit_code = c.exit_code if isinstance(c.exit_code, int) else job.exit_code
        return (job.exit_code,)
    if to == S.QUEUED:
        job.restarts = c.restarts
        return (job.restarts,)
    return ()


@transaction.atomic
def _apply_chunk(pool: Pool, pairs: list[tuple[SlurmJob, dict[str, Any]]]) -> int:
    now = timezone.now()
    by_job = {link.job_id: (link, record) for link, record in pairs}
    locked = Job.objects.select_for_update().filter(pk__in=sorted(by_job)).order_by("pk")
    changes = [_plan(job, *by_job[job.pk], now) for job in locked if not job.is_terminal]
    mirror = _Mirror(pool)
    for k in range(max((len(c.steps) for c in changes), default=0)):
        by_target: dict[str, list[_Change]] = {}
        for c in changes:
            if k < len(c.steps):
                by_target.setdefault(c.steps[k], []).append(c)
        for to, group in by_target.items():
            rows = [(c.job.pk, c.job.state, *_step_values(c, to, now)) for c in group]
            if to == S.SCHEDULED:
                _allocate(mirror, group)  # before the move: its listeners see the GPUs
            jobs_transition_bulk(
                rows=rows,
                to=to,
                reasons={
                    c.job.pk: f"Slurm: {c.link.state or '?'} "
                    f"({c.t.words or c.link.reason or 'no reason'})"
                    for c in group
                },
                actor_label=ACTOR,
                data={
                    c.job.pk: {"slurm_job_id": c.link.slurm_job_id, "slurm_state": c.link.state}
                    for c in group
                },
                update_fields=FIELDS_FOR.get(to, ()),
                now=now,
                end_reason=Allocation.EndReason.PREEMPTED if to == S.QUEUED else None,
            )
            for c in group:
                c.job.state = to
    _slurm_end_times(changes)
    waiting = []
    for c in changes:
        if c.job.state == S.QUEUED:
            message = c.t.words if c.t.state == S.QUEUED else c.job.pending_message
            if message != c.job.pending_message or c.job.pending_reason != "slurm":
                waiting.append((c.job.pk, "slurm", message[:500]))
    bulk_update_rows(Job, ["pending_reason", "pending_message"], waiting)
    bulk_update_rows(
        SlurmJob,
        ["state", "reason", "nodes", "seen_at", "restarts"],
        [
            (c.link.pk, c.link.state, c.link.reason, c.link.nodes, now, c.link.restarts)
            for c in changes
        ],
    )
    return sum(c.job.state != c.before for c in changes)


def _slurm_end_times(changes: list[_Change]) -> None:
    """Slurm's end time on the allocations of the runs that ended, not the moment this pass
    noticed (metering reads the same from sacct)."""
    ended = {c.job.pk: c for c in changes if c.end is not None and c.job.state not in ACTIVE_STATES}
    if not ended:
        return
    rows = [
        (pk, ended[job_id].end)
        for pk, job_id, attempt in Allocation.objects.filter(
            job_id__in=list(ended), meter__isnull=True, ended_at__isnull=False
        ).values_list("pk", "job_id", "attempt")
        if attempt == ended[job_id].job.attempt
    ]
    bulk_update_rows(Allocation, ["ended_at"], rows)


def _allocate(mirror: _Mirror, group: list[_Change]) -> None:
    rows = []
    unmatched = []
    for c in group:
        job = c.job
        gpus = mirror.gpus(c.record, job.gpu_count)
        rows += [
            Allocation(
                job=job,
                gpu=gpu,
                node_id=gpu.node_id,
                attempt=job.attempt,
                share_milli=1000,
                billed_milli=1000,  # a whole GPU
                memory_mib=gpu.memory_mib,
                gpu_model_id=gpu.model_id,
                borrowed=job.borrowed,
                started_at=c.start or timezone.now(),
            )
            for gpu in gpus
        ]
        if not gpus:
            unmatched.append(
                JobEvent(
                    job=job,
                    from_state=S.SCHEDULED,
                    to_state=S.SCHEDULED,
                    actor_label=ACTOR,
                    reason=f"Slurm runs it on {c.link.nodes or '?'}, but no mirrored GPU "
                    "matches: its usage is metered from sacct",
                )
            )
    Allocation.objects.bulk_create(rows, ignore_conflicts=True)
    JobEvent.objects.bulk_create(unmatched)


def sync_all() -> dict[str, int]:
    """The periodic task's body: every Slurm pool, one pass each."""
    from scheduler.backends.slurm.models import SlurmPool

    totals = {"pools": 0, "seen": 0, "moved": 0, "errors": 0}
    for cfg in SlurmPool.objects.select_related("pool").filter(pool__backend=Pool.Backend.SLURM):
        try:
            counts = sync_pool(cfg.pool)
        except SlurmError as exc:
            cfg.last_error = str(exc)[:500]
            cfg.save(update_fields=["last_error"])
            totals["errors"] += 1
            continue
        totals["pools"] += 1
        totals["seen"] += counts["seen"]
        totals["moved"] += counts["moved"]
    return totals
