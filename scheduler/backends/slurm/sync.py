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

from scheduler.backends.slurm.client import SlurmError, cluster_for
from scheduler.backends.slurm.models import SlurmJob
from scheduler.backends.slurm.nodes import hostlist, mirror_name, parse_indexes, sync_nodes
from scheduler.models import Allocation, Gpu, Job, JobEvent, JobState, Node, Pool
from scheduler.transitions import TRANSITIONS, job_transition

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
    moved = 0
    for link in links:
        record = queue.get(link.slurm_job_id) or done.get(link.slurm_job_id)
        if record is None or _unchanged(link, record):
            continue  # a waiting job Slurm says the same of costs no lock and no write
        if apply(link, record):
            moved += 1
    cfg.last_sync_at = timezone.now()
    cfg.last_error = ""
    cfg.save(update_fields=["last_sync_at", "last_error"])
    return {"seen": len(links), "moved": moved}


def _gpus_for(pool: Pool, record: dict[str, Any], count_hint: int) -> list[Gpu]:
    """The mirrored GPUs Slurm gave the job (squeue's gres_detail per node, in node order)."""
    from scheduler.backends.slurm.nodes import parse_gres

    names = hostlist(record.get("nodes") or "")
    details = record.get("gres_detail") or []
    gpus: list[Gpu] = []
    for i, name in enumerate(names):
        node = Node.objects.filter(name=mirror_name(pool, name)).first()
        if node is None:
            continue
        detail = details[i] if i < len(details) else ""
        idx = parse_indexes(detail)
        if not idx:
            per_node = sum(c for _, c in parse_gres(detail)) or max(1, count_hint // len(names))
            idx = list(range(per_node))
        gpus.extend(Gpu.objects.filter(node=node, index__in=idx).order_by("index"))
    return gpus


def _unchanged(link: SlurmJob, record: dict[str, Any]) -> bool:
    return (
        link.seen_at is not None
        and link.state == str(record.get("job_state", ""))[:32]
        and link.reason == str(record.get("state_reason", ""))[:64]
        and link.nodes == str(record.get("nodes") or "")[:500]
        and int(record.get("restart_cnt") or 0) <= link.restarts
    )


@transaction.atomic
def apply(link: SlurmJob, record: dict[str, Any]) -> bool:
    """Bring our job to what Slurm says. True when our state changed."""
    job = Job.objects.select_for_update().get(pk=link.job_id)
    if job.is_terminal:
        return False
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
    link.seen_at = timezone.now()
    requeued = restarts > link.restarts
    link.restarts = max(link.restarts, restarts)
    link.save(update_fields=["state", "reason", "nodes", "seen_at", "restarts"])
    start = _when(record.get("start_time"))
    end = _when(record.get("end_time"))
    before = job.state
    steps = path(job.state, t.state)
    if requeued and job.state in (S.SCHEDULED, S.STARTING, S.RUNNING):
        # Slurm requeued it (preempted) since the last pass: the old run ends here, even when
        # the new one already runs
        steps = path(job.state, S.QUEUED) + path(S.QUEUED, t.state)
    for to in steps:
        fields: tuple[str, ...] = ()
        if to == S.SCHEDULED:
            job.attempt = restarts + 1
            fields = ("attempt",)
        if to == S.RUNNING and start is not None:
            job.started_at = job.started_at or start
            fields = ("started_at",)
        if to in (S.FAILED, S.CANCELLED) and t.words:
            job.failure_reason = t.words[:500]
            fields = ("failure_reason",)
        if to == S.SUCCEEDED and isinstance(exit_code, int):
            job.exit_code = exit_code
            fields = ("exit_code",)
        if to == S.QUEUED:
            job.restarts = restarts
            fields = ("restarts",)
        job_transition(
            job=job,
            to=to,
            reason=f"Slurm: {link.state or '?'} ({t.words or link.reason or 'no reason'})",
            actor_label=ACTOR,
            data={"slurm_job_id": link.slurm_job_id, "slurm_state": link.state},
            update_fields=fields,
            end_reason=(Allocation.EndReason.PREEMPTED if to == S.QUEUED else None),
        )
        if to == S.SCHEDULED:
            _allocate(job, link, record, start or timezone.now())
    if job.state not in (S.SCHEDULED, S.STARTING, S.RUNNING, S.PREEMPTING) and end is not None:
        # Slurm's end time, not the moment this pass noticed (metering reads the same from sacct)
        Allocation.objects.filter(job=job, attempt=job.attempt, meter__isnull=True).exclude(
            ended_at=None
        ).update(ended_at=end)
    if job.state == S.QUEUED:
        message = t.words if t.state == S.QUEUED else job.pending_message
        if message != job.pending_message or job.pending_reason != "slurm":
            job.pending_reason, job.pending_message = "slurm", message[:500]
            job.save(update_fields=["pending_reason", "pending_message"])
    return job.state != before


def _allocate(job: Job, link: SlurmJob, record: dict[str, Any], start: datetime) -> None:
    gpus = _gpus_for(link.pool, record, job.gpu_count)
    rows = [
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
            started_at=start,
        )
        for gpu in gpus
    ]
    Allocation.objects.bulk_create(rows, ignore_conflicts=True)
    if not rows:
        JobEvent.objects.create(
            job=job,
            from_state=job.state,
            to_state=job.state,
            actor_label=ACTOR,
            reason=f"Slurm runs it on {link.nodes or '?'}, but no mirrored GPU matches: "
            "its usage is metered from sacct",
        )


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
