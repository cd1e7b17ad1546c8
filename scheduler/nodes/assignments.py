"""What each node must run or stop, as its agent reads it.

Fast path: the assignment read is a compiled query (`foundation.db.CompiledQuery`), since every
agent reads it whenever its assignments change; `bench.submit_throughput` (submit to running,
agents syncing) and `bench.agent_requests` measure it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, NamedTuple

from django.utils import timezone

from agent.protocol import Assignment as AssignmentMessage
from agent.protocol import CheckpointPlace
from foundation.db import CompiledQuery
from scheduler.gangs import rendezvous_env, single_node_env
from scheduler.job_volumes import assignment_volumes, checkpoint_split
from scheduler.models import ACTIVE_STATES, Allocation, JobState, Node
from storage.models import LIVE_STATES, Volume, VolumeKind, VolumeState

# How long the heartbeat keeps naming a deleted node-local volume (the agent may be down).
DELETED_VOLUME_NOTICE = timedelta(days=1)


class AssignedRow(NamedTuple):
    """One active allocation on the node with what its agent needs of the job."""

    job_id: int
    share_milli: int
    memory_mib: int
    gpu_uuid: str
    attempt: int
    state: str
    command: str
    env: dict[str, Any]
    secret_env: dict[str, Any]
    volumes: list[dict[str, Any]]
    checkpoint: str
    resume: bool
    shard_index: int | None
    shard_count: int | None
    working_dir: str
    grace_seconds: int
    image: str
    time_limit_s: int | None
    cpu_milli: int
    job_memory_mib: int
    shm_mib: int
    gpus: int
    rendezvous_port: int | None
    resize: dict[str, Any]
    project_id: int


# Compiled once (`CompiledQuery`): every agent reads this whenever its assignments change.
_ASSIGNED = CompiledQuery(
    lambda node_id: (
        Allocation.objects.filter(
            node_id=node_id,
            ended_at__isnull=True,
            job__state__in=ACTIVE_STATES,
        )
        .order_by("job_id", "gpu__index")
        .values_list(
            "job_id",
            "share_milli",
            "memory_mib",
            "gpu__uuid",
            "job__attempt",
            "job__state",
            "job__command",
            "job__env",
            "job__secret_env",
            "job__volumes",
            "job__checkpoint",
            "job__resume",
            "job__shard_index",
            "job__shard_count",
            "job__working_dir",
            "job__grace_seconds",
            "job__image",
            "job__time_limit_s",
            "job__cpu_milli",
            "job__memory_mib",
            "job__shm_mib",
            "job__gpus",
            "job__rendezvous_port",
            "job__resize",
            "job__project_id",
        )
    )
)


def assignments_for(node: Node) -> list[AssignmentMessage]:
    """What the node must run or stop: jobs with active allocations on it (one compiled
    query: every agent reads this whenever its assignments change)."""
    if node.fenced:
        return []
    by_job: dict[int, list[AssignedRow]] = {}
    for raw in _ASSIGNED.rows(node_id=node.pk):
        row = AssignedRow._make(raw)
        by_job.setdefault(row.job_id, []).append(row)
    gangs = rendezvous_env(
        [job_id for job_id, rows in by_job.items() if rows[0].rendezvous_port is not None],
        node.pk,
    )
    volumes = _volume_rows([row for rows in by_job.values() for row in rows[:1]])
    out: list[AssignmentMessage] = []
    for job_id, rows in by_job.items():
        first = rows[0]
        # the job's secret values reach only this node, the one that runs it
        env = {str(k): str(v) for k, v in {**first.env, **(first.secret_env or {})}.items()}
        env["JOB_ID"] = str(job_id)
        env["RESUME"] = "1" if first.resume else "0"
        if first.shard_index is not None:
            env["SHARD_INDEX"] = str(first.shard_index)
            env["SHARD_COUNT"] = str(first.shard_count or 1)
        # the rendezvous torchrun and torch.distributed read (a gang's, or a world of one node)
        env.update(gangs.get(job_id) or single_node_env(len(rows)))
        preempting = first.state == JobState.PREEMPTING
        stop_reason = ("resize" if first.resize else "preempt") if preempting else None
        out.append(
            {
                "job_id": job_id,
                "attempt": first.attempt,
                "action": "stop" if preempting else "run",
                "stop_reason": stop_reason,
                "command": first.command,
                "env": env,
                "gpu_uuids": [row.gpu_uuid for row in rows],
                "share_milli": min(first.share_milli if len(rows) == 1 else 1000, 1000),
                "gpu_memory_limit_mib": first.memory_mib or None,
                "working_dir": first.working_dir or None,
                "grace_seconds": first.grace_seconds,
                "image": first.image,
                "time_limit_s": first.time_limit_s,
                "cpu_milli": first.cpu_milli,
                "memory_mib": first.job_memory_mib,
                "shm_mib": first.shm_mib,
                # storage (issue 27): ids, kinds, container paths and limits; the agent derives
                # every host path itself (its CHECKPOINT_DIR is the checkpoint's container path)
                "project_id": first.project_id,
                "volumes": assignment_volumes(
                    first.volumes or [], volumes.get(first.project_id, {})
                ),
                "checkpoint": _checkpoint(first.checkpoint),
            }
        )
    return out


def _volume_rows(firsts: list[AssignedRow]) -> dict[int, dict[str, Volume]]:
    """The live project volumes the jobs mount: project id → name → volume (one query, none
    when no job mounts one)."""
    wanted = {
        (row.project_id, m["name"])
        for row in firsts
        for m in row.volumes or []
        if m.get("kind") != "scratch"
    }
    if not wanted:
        return {}
    out: dict[int, dict[str, Volume]] = {}
    rows = Volume.objects.filter(
        project_id__in={p for p, _ in wanted},
        name__in={n for _, n in wanted},
        state__in=LIVE_STATES,
    ).only("pk", "project_id", "name", "kind", "size_gib", "is_dataset")
    for v in rows:
        out.setdefault(v.project_id, {})[v.name] = v
    return out


def _checkpoint(checkpoint: str) -> CheckpointPlace | None:
    place = checkpoint_split(checkpoint)
    return None if place is None else {"volume": place[0], "path": place[1]}


def deleted_volumes_for(node: Node) -> list[int]:
    """Node-local volumes on this node that the portal deleted: the heartbeat answer's
    `deleted_volumes` (the agent removes their directories; idempotent, so a volume is named
    until a day after its deletion)."""
    since = timezone.now() - DELETED_VOLUME_NOTICE
    return list(
        Volume.objects.filter(
            kind=VolumeKind.NODE_LOCAL,
            node_name=node.name,
            state=VolumeState.DELETED,
            deleted_at__gte=since,
        ).values_list("pk", flat=True)[:1000]
    )
