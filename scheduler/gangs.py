"""Gangs: a job placed on several nodes runs as one member per node, and is one unit.

Each member's environment is what `torchrun` and `torch.distributed` read (`rendezvous_env`):
`MASTER_ADDR` (rank 0's node address) and `MASTER_PORT` (a port of `GANG_PORTS` on rank 0's
node that no other active gang with its rendezvous at that address holds), `WORLD_SIZE` (the
job's GPUs: one process per GPU), `RANK` (the global rank of the member's first GPU),
`LOCAL_RANK` 0, `NODE_RANK` (the member's rank), `LOCAL_WORLD_SIZE` (its GPUs) and `NNODES`.
A member that runs one process per GPU starts them with
`torchrun --nnodes=$NNODES --nproc-per-node=$LOCAL_WORLD_SIZE --node-rank=$NODE_RANK
--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT`; one process per member with one GPU each uses the
variables as they are (`init_process_group(init_method="env://")`).

The members of an attempt are `JobMember` rows, written when the cycle places the job. The job
is running once every member has started, succeeds once every member has exited 0, and the
first member that fails fails (or requeues) the whole job: its allocations end, so the other
members' agents stop them (SIGTERM, the job's grace, SIGKILL). A single-node job has no member
rows; its environment says it is a world of its GPUs on one node (`MASTER_PORT` is then chosen
by the agent, which knows the node's free ports).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from datetime import datetime

from django.conf import settings
from django.db.models import F

from scheduler.models import ACTIVE_STATES, Job, JobMember, Node


def gang_ports() -> range:
    base, count = int(settings.GANG_PORT_BASE), int(settings.GANG_PORT_COUNT)
    return range(base, base + count)


def members_create(
    placed: Sequence[tuple[int, int, list[tuple[int, int]]]], *, now: datetime
) -> dict[int, int]:
    """Write the members of newly placed gangs: `(job_id, attempt, [(node_id, gpus), ...])`
    with the nodes in rank order (rank 0 first). Returns each job's rendezvous port, which the
    caller stores on the job. Single-node placements are not gangs and are skipped."""
    gangs = [(job_id, attempt, nodes) for job_id, attempt, nodes in placed if len(nodes) > 1]
    if not gangs:
        return {}
    node_ids = {nodes[0][0] for _, _, nodes in gangs}
    address = dict(Node.objects.filter(pk__in=node_ids).values_list("pk", "address"))
    used: dict[str, set[int]] = {}
    for node_id, addr, port in JobMember.objects.filter(
        rank=0,
        job__state__in=ACTIVE_STATES,
        job__rendezvous_port__isnull=False,
    ).values_list("node_id", "node__address", "job__rendezvous_port"):
        if port is not None:
            used.setdefault(addr or f"node:{node_id}", set()).add(port)
    ports = gang_ports()
    rows: list[JobMember] = []
    chosen: dict[int, int] = {}
    for job_id, attempt, nodes in gangs:
        key = address.get(nodes[0][0]) or f"node:{nodes[0][0]}"
        taken = used.setdefault(key, set())
        free = [p for p in ports if p not in taken]
        if not free:
            raise RuntimeError(f"no rendezvous port left at {key}; widen GANG_PORT_COUNT")
        # a random free one: a port a crashed job left bound is unlikely to be picked again
        port = random.choice(free[:64])
        taken.add(port)
        chosen[job_id] = port
        first = 0
        for rank, (node_id, gpus) in enumerate(nodes):
            rows.append(
                JobMember(
                    job_id=job_id,
                    attempt=attempt,
                    rank=rank,
                    first_rank=first,
                    gpus=gpus,
                    node_id=node_id,
                )
            )
            first += max(1, gpus)
    JobMember.objects.bulk_create(rows)
    return chosen


def single_node_env(gpus: int) -> dict[str, str]:
    """The rendezvous of a job on one node: a world of its GPUs (the agent adds the port)."""
    n = str(max(1, gpus))
    return {
        "MASTER_ADDR": "127.0.0.1",
        "WORLD_SIZE": n,
        "RANK": "0",
        "LOCAL_RANK": "0",
        "NODE_RANK": "0",
        "LOCAL_WORLD_SIZE": n,
        "NNODES": "1",
    }


def rendezvous_env(job_ids: Iterable[int], node_id: int) -> dict[int, dict[str, str]]:
    """Each gang's rendezvous variables for its member on `node_id` (current attempts only)."""
    ids = list(job_ids)
    if not ids:
        return {}
    rows = list(
        JobMember.objects.filter(job_id__in=ids, attempt=F("job__attempt"))
        .order_by("job_id", "rank")
        .values_list(
            "job_id",
            "rank",
            "first_rank",
            "gpus",
            "node_id",
            "node__address",
            "node__name",
            "job__rendezvous_port",
        )
    )
    by_job: dict[int, list[tuple[int, int, int, int, str, str, int | None]]] = {}
    for job_id, *rest in rows:
        by_job.setdefault(job_id, []).append(tuple(rest))  # type: ignore[arg-type]
    out: dict[int, dict[str, str]] = {}
    for job_id, members in by_job.items():
        master = members[0]
        world = sum(max(1, m[2]) for m in members)
        for rank, first_rank, gpus, member_node, _addr, _name, port in members:
            if member_node != node_id:
                continue
            out[job_id] = {
                "MASTER_ADDR": master[4] or master[5],
                "MASTER_PORT": str(port or ""),
                "WORLD_SIZE": str(world),
                "RANK": str(first_rank),
                "LOCAL_RANK": "0",
                "NODE_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(max(1, gpus)),
                "NNODES": str(len(members)),
            }
    return out


def member_started(job: Job, node_id: int, *, now: datetime) -> bool:
    """Mark the job's member on `node_id` running; whether every member now runs."""
    JobMember.objects.filter(
        job_id=job.pk, attempt=job.attempt, node_id=node_id, state=JobMember.State.SCHEDULED
    ).update(state=JobMember.State.RUNNING, started_at=now)
    return not JobMember.objects.filter(
        job_id=job.pk, attempt=job.attempt, state=JobMember.State.SCHEDULED
    ).exists()


def member_exited(
    job: Job, node_id: int, *, exit_code: int | None, message: str, now: datetime
) -> bool:
    """Record a member's exit; whether every member has now exited 0."""
    ok = exit_code == 0
    JobMember.objects.filter(
        job_id=job.pk,
        attempt=job.attempt,
        node_id=node_id,
        state__in=[JobMember.State.SCHEDULED, JobMember.State.RUNNING],
    ).update(
        state=JobMember.State.SUCCEEDED if ok else JobMember.State.FAILED,
        exit_code=exit_code,
        message=message[:300],
        ended_at=now,
    )
    return ok and not (
        JobMember.objects.filter(job_id=job.pk, attempt=job.attempt)
        .exclude(state=JobMember.State.SUCCEEDED)
        .exists()
    )


def members_end(job_id: int, attempt: int, *, lost: bool, now: datetime) -> None:
    """The job left its GPUs: members still scheduled or running were stopped (or lost)."""
    JobMember.objects.filter(
        job_id=job_id,
        attempt=attempt,
        state__in=[JobMember.State.SCHEDULED, JobMember.State.RUNNING],
    ).update(state=JobMember.State.LOST if lost else JobMember.State.STOPPED, ended_at=now)


def is_gang(job: Job) -> bool:
    return job.rendezvous_port is not None
