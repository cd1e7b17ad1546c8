"""The cycle's state step: the rows `reads` returns as the pure core's immutable values.

`build_state` reads nodes, GPUs, active allocations, queued jobs and quotas, in named steps,
into the `Snapshot` and queue the core plans against (and what apply needs to map the plan
back to rows). The dry run builds its hypothetical job with `job_request`.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC as _UTC
from datetime import datetime, timedelta
from typing import Any

import scheduler.cycle.reads as reads
from scheduler import elastic, ports
from scheduler.core.model import (
    MILLI,
    GpuView,
    JobRequest,
    NodeView,
    ProjectQuota,
    RunningWork,
    Share,
    Snapshot,
    device_share_milli,
    gpu_capacity_milli,
    memory_gb_as_mib,
    planned_runtime_s,
)
from scheduler.cycle.volumes import pinned, volume_pins
from scheduler.models import (
    Gpu,
    Job,
    JobState,
    Node,
)

FAIR_SHARE_HALF_LIFE_H = 24.0
PREEMPTION_MEMORY_S = (
    3600  # a job preempted within this long is not placed by preempting its preemptor
)


def ts(dt: datetime) -> float:
    return dt.timestamp()


def from_ts(value: float) -> datetime:
    return datetime.fromtimestamp(value, tz=_UTC)


@dataclass
class CycleInput:
    """One cycle's input read from the database: the core's snapshot and queue, plus what
    `apply_plan` and `record_pending` need to map the plan back to rows. (Not the core's
    `scheduler.core.state.ClusterState`, which is the planner's array form of a snapshot.)"""

    snapshot: Snapshot
    queue: list[JobRequest]
    # Each queued job's current (reason, message, position, estimated start), to write changes only.
    pending_now: dict[int, tuple[str, str, int | None, datetime | None]] = field(
        default_factory=dict
    )
    # The idle GPUs held for grows in flight, by job (`elastic.holds`): taken, for apply too.
    holds: dict[int, list[elastic.Held]] = field(default_factory=dict)
    # Each queued job's project id, for the pages told of what the cycle did to it.
    project_of: dict[int, int] = field(default_factory=dict)
    # Queued jobs that mount node-local volumes with no node yet: apply binds them.
    unbound_volumes: dict[int, list[tuple[int, str]]] = field(default_factory=dict)


def job_request(job: Job, *, preempted_by: frozenset[int] = frozenset()) -> JobRequest:
    """The core's view of a Job instance (the dry run's hypothetical job)."""
    return job_request_from_row(
        reads.QueuedJobRow(
            pk=job.pk,
            project_slug=job.project.slug,
            gpus=job.gpus,
            gpu_milli=job.gpu_milli,
            gpu_memory_mib=job.gpu_memory_mib,
            nodes=job.nodes,
            gpus_per_node=job.gpus_per_node,
            gpu_model=job.gpu_model.name if job.gpu_model is not None else None,
            min_gpu_memory_gb=job.min_gpu_memory_gb,
            cpu_milli=job.cpu_milli,
            memory_mib=job.memory_mib,
            priority=job.priority,
            preemptible=job.preemptible,
            borrowed=job.borrowed,
            runtime_estimate_s=job.runtime_estimate_s,
            time_limit_s=job.time_limit_s,
            elastic_min=job.elastic_min,
            elastic_max=job.elastic_max,
            pool=job.pool.name if job.pool is not None else None,
            submitted_s=ts(job.queued_at or job.created_at),
            precisions_json="",
            project_id=job.project_id,
            pending_reason=job.pending_reason,
            pending_message=job.pending_message,
            queue_position=job.queue_position,
            estimated_start_at=job.estimated_start_at,
            gpu_models_json="",
            volumes_json=json.dumps(job.volumes or []),
            checkpoint=job.checkpoint,
        ),
        frozenset(job.precisions),
        preempted_by,
        frozenset(job.gpu_models),
    )


def job_request_from_row(
    row: reads.QueuedJobRow,
    precisions: frozenset[str],
    preempted_by: frozenset[int],
    any_of: frozenset[str] = frozenset(),
) -> JobRequest:
    """A JobRequest from a queued job's row (`precisions` decoded by the caller).

    `any_of`: the job's allowed models (`Job.gpu_models`, decoded by the caller) when it
    names no single model."""
    return JobRequest(
        job_id=row.pk,
        project=row.project_slug,
        submitted_at=row.submitted_s,
        gpus=row.gpus,
        gpu_milli=row.gpu_milli,
        gpu_memory_mib=row.gpu_memory_mib,
        nodes=row.nodes,
        gpus_per_node=row.gpus_per_node,
        models=frozenset({row.gpu_model}) if row.gpu_model else any_of,
        min_gpu_memory_mib=memory_gb_as_mib(row.min_gpu_memory_gb),
        precisions=precisions,
        cpu_milli=row.cpu_milli,
        memory_mib=row.memory_mib,
        priority=row.priority,
        preemptible=row.preemptible or row.borrowed,
        runtime_estimate_s=planned_runtime_s(row.runtime_estimate_s, row.time_limit_s),
        elastic_min=row.elastic_min,
        elastic_max=row.elastic_max,
        pool=row.pool,
        preempted_by=preempted_by,
    )


def _decayed_usage(
    project_ids: set[int], now: datetime, active: list[reads.ActiveAllocationRow]
) -> dict[int, float]:
    """GPU-hours per project over the last week, halved every FAIR_SHARE_HALF_LIFE_H hours; a
    share counts as the part of its device it holds (`device_share_milli`), as quotas count
    GPU-hours and billing bills them.

    `active` holds the active allocations, already read by the snapshot; only the allocations that ended within the week are read here.
    """
    usage: dict[int, float] = defaultdict(float)
    since = now - timedelta(days=7)
    now_s, since_s = ts(now), ts(since)
    rows: list[tuple[int, int, float, float, str, int]] = [
        (
            a.project_id,
            a.share_milli,
            a.started_s,
            now_s,
            a.gpu_sharing_mode,
            a.gpu_oversubscription,
        )
        for a in active
        if a.project_id in project_ids
    ]
    rows += reads.ENDED_ALLOCATIONS.rows(project_ids=list(project_ids), since=since)
    for project_id, share, started, end, sharing, factor in rows:
        held = device_share_milli(share, gpu_capacity_milli(sharing, factor))
        hours = max(0.0, end - max(started, since_s)) / 3600 * held / MILLI
        age_h = (now_s - end) / 3600
        usage[project_id] += hours * math.pow(0.5, age_h / FAIR_SHARE_HALF_LIFE_H)
    return usage


class _Reused:
    """The previous snapshot's running work and GPU views, each with the rows it was made from.

    A burst's passes, a quarter of a second apart, read the same running jobs and GPUs again
    (`bench.cycle_cost`: the per-allocation and per-node terms); a value whose rows are unchanged
    is taken again instead of rebuilt. The values are immutable, so two builders at once (the
    cycle and the availability estimate) at worst rebuild more."""

    def __init__(self) -> None:
        self.running: dict[int, tuple[tuple[Any, ...], RunningWork]] = {}
        self.gpus: dict[int, tuple[tuple[Any, ...], GpuView]] = {}


_REUSE = _Reused()
_RUNNING, _PREEMPTING = JobState.RUNNING.value, JobState.PREEMPTING.value


def node_unavailable(state: str, fenced: bool, has_spoken: bool) -> str:
    """Why a node takes no work, in words for a waiting job's reason ("" when it takes work)."""
    if state != Node.State.READY:
        return str(Node.State(state).label).lower()
    if fenced:
        return "fenced until its agent reports"
    return "" if has_spoken else "waiting for its agent"


def build_state(
    *, now: datetime, extra_jobs: list[Job] | None = None, with_usage: bool = True
) -> CycleInput:
    """Read nodes, GPUs, active allocations, queued jobs and quotas into immutable core values.

    Plain rows, not model instances: the cycle reads tens of thousands of rows.
    `with_usage=False` leaves the projects' decayed usage at zero without reading the week's
    ended allocations; only the fair-share queue policy reads it (`orders_by_fair_share`).
    """
    # Active allocations with their job's columns in one read (consistent, no id list).
    active = reads.ACTIVE_ALLOCATIONS.rows()
    in_use = _in_use(active)
    running, node_use, project_ids = _running_work(in_use.by_job, now_s=ts(now))
    node_views = _node_views(_gpu_views(in_use), node_use)
    queued = _queued(now=now, extra_jobs=extra_jobs or [])
    project_ids |= queued.project_ids
    snapshot = Snapshot(
        nodes=tuple(node_views),
        running=tuple(running),
        quotas=_project_quotas(project_ids, now=now, active=active, with_usage=with_usage),
        model_precisions={
            name: frozenset(precisions) for name, precisions in reads.MODEL_PRECISIONS.rows()
        },
    )
    return CycleInput(
        snapshot=snapshot,
        queue=queued.queue,
        pending_now=queued.pending_now,
        holds=in_use.holds,
        project_of=queued.project_of,
        unbound_volumes=queued.unbound_volumes,
    )


@dataclass
class _InUse:
    """What the active allocations (and the GPUs held for grows) take of each GPU, by job."""

    used_milli: dict[int, int]
    used_mem: dict[int, int]
    by_job: dict[int, list[reads.ActiveAllocationRow]]
    holds: dict[int, list[elastic.Held]]


def _in_use(active: list[reads.ActiveAllocationRow]) -> _InUse:
    """Step 1: each GPU's share and memory in use, and each job's allocation rows."""
    used_milli: dict[int, int] = defaultdict(int)
    used_mem: dict[int, int] = defaultdict(int)
    by_job: dict[int, list[reads.ActiveAllocationRow]] = defaultdict(list)
    for row in active:
        used_milli[row.gpu_id] += row.share_milli
        used_mem[row.gpu_id] += row.memory_mib
        by_job[row.job_id].append(row)
    # The idle GPUs held for a grow in flight are the growing job's already: nothing else is
    # planned onto them while it checkpoints (scheduler/elastic.py). Only a job stopping
    # (`preempting`) can have some: no read at all when none is.
    holds = elastic.holds() if any(r.state == JobState.PREEMPTING for r in active) else {}
    for job_id, held in holds.items():
        own = by_job.get(job_id)
        if not own:
            continue
        template = own[0]
        for h in held:
            used_milli[h.gpu_id] += h.milli
            used_mem[h.gpu_id] += h.memory_mib
            own.append(
                template._replace(
                    node_id=h.node_id, gpu_id=h.gpu_id, share_milli=h.milli, memory_mib=h.memory_mib
                )
            )
    return _InUse(used_milli=used_milli, used_mem=used_mem, by_job=by_job, holds=holds)


@dataclass
class _NodeUse:
    """The CPU and memory the running jobs take of each node."""

    cpu_milli: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    memory_mib: dict[int, int] = field(default_factory=lambda: defaultdict(int))

    def add(self, allocs: list[reads.ActiveAllocationRow]) -> None:
        """A job's CPU and memory, split over its nodes by its GPUs on each."""
        job = allocs[0]  # the job's columns repeat on each of its allocation rows
        if len(allocs) == 1:
            self.cpu_milli[job.node_id] += job.job_cpu_milli
            self.memory_mib[job.node_id] += job.job_memory_mib
            return
        per_node: dict[int, int] = defaultdict(int)
        for a in allocs:
            per_node[a.node_id] += 1
        for node_id, count in per_node.items():
            self.cpu_milli[node_id] += job.job_cpu_milli * count // len(allocs)
            self.memory_mib[node_id] += job.job_memory_mib * count // len(allocs)


def _running_work(
    by_job: dict[int, list[reads.ActiveAllocationRow]], *, now_s: float
) -> tuple[list[RunningWork], _NodeUse, set[int]]:
    """Step 2: each running job as the core's `RunningWork` (reused when its rows are unchanged),
    what they take of each node, and their projects."""
    node_use = _NodeUse()
    running: list[RunningWork] = []
    project_ids: set[int] = set()
    reused, kept = _REUSE.running, {}  # see `_Reused`
    for job_id, allocs in by_job.items():
        job = allocs[0]
        project_ids.add(job.project_id)
        node_use.add(allocs)
        started_s = job.started_s if len(allocs) == 1 else min(a.started_s for a in allocs)
        # Only running work is resized: a job starting, or stopping for a resize already in
        # flight, is not planned again; it grows only once past its minimum runtime.
        grows = job.state == _RUNNING and now_s - started_s >= job.min_runtime_s
        key = (allocs, grows)
        known = reused.get(job_id)
        if known is not None and known[0] == key:
            work = known[1]
        else:
            work = _running_work_of(job_id, allocs, started_s=started_s, grows=grows)
        kept[job_id] = (key, work)
        running.append(work)
    _REUSE.running = kept
    return running, node_use, project_ids


def _running_work_of(
    job_id: int, allocs: list[reads.ActiveAllocationRow], *, started_s: float, grows: bool
) -> RunningWork:
    """One running job's `RunningWork` from its allocation rows."""
    job = allocs[0]
    resizable = job.state == _RUNNING
    return RunningWork(
        job_id=job_id,
        project=job.project_slug,
        priority=job.priority,
        preemptible=(job.preemptible or job.borrowed) and job.state != _PREEMPTING,
        started_at=started_s,
        min_runtime_s=job.min_runtime_s,
        runtime_estimate_s=planned_runtime_s(job.runtime_estimate_s, job.time_limit_s),
        shares=tuple(
            Share(
                node_id=a.node_id,
                gpu_id=a.gpu_id,
                milli=a.share_milli,
                memory_mib=a.memory_mib,
            )
            for a in allocs
        ),
        elastic_min=job.elastic_min if resizable else None,
        elastic_max=job.elastic_max if grows else None,
        borrowed=job.borrowed,
        cpu_milli=job.job_cpu_milli,
        memory_mib=job.job_memory_mib,
    )


def _gpu_views(in_use: _InUse) -> dict[int, list[GpuView]]:
    """Step 3: each node's GPUs as the core's `GpuView`s (reused when unchanged)."""
    gpus_of: dict[int, list[GpuView]] = defaultdict(list)
    reused_gpus, kept_gpus = _REUSE.gpus, {}
    for g in reads.GPUS.rows():
        gpu_key = (g, in_use.used_milli[g.pk], in_use.used_mem[g.pk])
        known_gpu = reused_gpus.get(g.pk)
        if known_gpu is not None and known_gpu[0] == gpu_key:
            view = known_gpu[1]
        else:
            view = GpuView(
                gpu_id=g.pk,
                index=g.gpu_index,
                model=g.model,
                memory_mib=g.memory_mib,
                capacity_milli=gpu_capacity_milli(g.sharing_mode, g.oversubscription),
                used_milli=gpu_key[1],
                used_memory_mib=gpu_key[2],
                sharing=g.sharing_mode,
                healthy=g.health != Gpu.Health.UNHEALTHY,
            )
        kept_gpus[g.pk] = (gpu_key, view)
        gpus_of[g.node_id].append(view)
    _REUSE.gpus = kept_gpus
    return gpus_of


def _node_views(gpus_of: dict[int, list[GpuView]], node_use: _NodeUse) -> list[NodeView]:
    """Step 4: each node as the core's `NodeView`, with what its running jobs leave free."""
    return [
        NodeView(
            node_id=n.pk,
            name=n.name,
            pool=n.pool,
            gpus=tuple(gpus_of[n.pk]),
            cpu_milli_free=max(0, n.cpu_milli - node_use.cpu_milli[n.pk]),
            memory_mib_free=max(0, n.memory_mib - node_use.memory_mib[n.pk]),
            labels=dict(n.labels),
            # Ready, not fenced, and its agent has spoken: work placed here will start.
            schedulable=n.state == Node.State.READY
            and not n.fenced
            and n.last_heartbeat_at is not None,
            unavailable=node_unavailable(n.state, n.fenced, n.last_heartbeat_at is not None),
        )
        for n in reads.NODES.rows()
    ]


@dataclass
class _Queued:
    """The queue as the core's `JobRequest`s, with what apply and `record_pending` need."""

    queue: list[JobRequest] = field(default_factory=list)
    pending_now: dict[int, tuple[str, str, int | None, datetime | None]] = field(
        default_factory=dict
    )
    project_of: dict[int, int] = field(default_factory=dict)
    project_ids: set[int] = field(default_factory=set)
    unbound_volumes: dict[int, list[tuple[int, str]]] = field(default_factory=dict)


def _recent_preemptors(*, now: datetime) -> dict[int, set[int]]:
    """The jobs each job was preempted for within PREEMPTION_MEMORY_S."""
    recent = now - timedelta(seconds=PREEMPTION_MEMORY_S)
    preempted_by: dict[int, set[int]] = defaultdict(set)
    for job_id, data in reads.RECENT_PREEMPTIONS.rows(since=recent):
        if isinstance(data, dict) and data.get("for_job"):
            preempted_by[job_id].add(int(data["for_job"]))
    return preempted_by


def _queued(*, now: datetime, extra_jobs: list[Job]) -> _Queued:
    """Step 5: the queued jobs (and the dry run's extra ones) as the core's queue."""
    queued = reads.QUEUED_JOBS.rows()
    preempted_by = _recent_preemptors(now=now)
    decoded: dict[str, frozenset[str]] = {}  # the same JSON text decoded once
    none: frozenset[int] = frozenset()
    out = _Queued()
    for r in queued:
        text = r.precisions_json
        if text not in decoded:
            decoded[text] = frozenset(json.loads(text))
        models = r.gpu_models_json
        if models not in decoded:
            decoded[models] = frozenset(json.loads(models))
        pk = r.pk
        out.queue.append(
            job_request_from_row(
                r,
                decoded[text],
                frozenset(preempted_by[pk]) if pk in preempted_by else none,
                decoded[models],
            )
        )
        out.project_ids.add(r.project_id)
        out.project_of[pk] = r.project_id
        out.pending_now[pk] = (
            r.pending_reason,
            r.pending_message,
            r.queue_position,
            r.estimated_start_at,
        )
    for extra in extra_jobs:
        out.queue.append(job_request(extra))
        if extra.project_id:
            out.project_ids.add(extra.project_id)
    mounting = [(r.pk, r.project_id, r.volumes_json, r.checkpoint) for r in queued]
    mounting += [
        (e.pk, e.project_id, json.dumps(e.volumes or []), e.checkpoint) for e in extra_jobs
    ]
    pins = volume_pins(mounting)
    out.queue = pinned(out.queue, pins)
    out.unbound_volumes = pins.unbound
    return out


def _project_quotas(
    project_ids: set[int],
    *,
    now: datetime,
    active: list[reads.ActiveAllocationRow],
    with_usage: bool,
) -> dict[str, ProjectQuota]:
    """Step 6: each project's quota, budget standing, reserved capacity and decayed usage."""
    ids = list(project_ids)
    limits: dict[int, dict[str, int]] = defaultdict(dict)
    for project_id, model_name, max_gpus in reads.QUOTA_MODEL_LIMITS.rows(project_ids=ids):
        limits[project_id][model_name] = max_gpus
    over_budget = ports.BUDGET_GATE.get()(project_ids=project_ids)
    at_cap = ports.BUDGET_CAPPED.get()(project_ids=project_ids)
    reserved = ports.RESERVED_CAPACITY.get()(now=now)
    usage = _decayed_usage(project_ids, now, active) if with_usage else {}
    return {
        slug: ProjectQuota(
            max_gpus=max_gpus,
            max_gpus_per_model=limits.get(project_id, {}),
            allow_borrowing=allow_borrowing,
            budget_exhausted=project_id in over_budget,
            budget_capped=project_id in at_cap,
            decayed_usage=usage.get(project_id, 0.0),
            reserved=reserved.get(slug, {}),
        )
        for project_id, slug, max_gpus, allow_borrowing in reads.QUOTAS.rows(project_ids=ids)
    }
