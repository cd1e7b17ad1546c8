"""The scheduling cycle: snapshot the database, plan in the pure core, apply in one transaction.

`apply` locks every GPU row a placement touches and re-checks capacity against the active
allocations it then sees, so no GPU is ever over-allocated, whatever runs concurrently.
A placement that no longer fits is dropped and retried on the next cycle.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC as _UTC
from datetime import datetime, timedelta
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from portal.db import bulk_update_rows, insert_rows
from scheduler import backends, elastic, gangs, ports
from scheduler import cycle_reads as reads
from scheduler.core.model import (
    GpuView,
    JobRequest,
    NodeView,
    ProjectQuota,
    RunningWork,
    Share,
    Snapshot,
    billed_share_milli,
    gpu_capacity_milli,
    planned_runtime_s,
)
from scheduler.core.plan import QUEUE_POLICIES, Plan, PolicyConfig, plan
from scheduler.core.reasons import PendingReason
from scheduler.core.scorers import SCORER_NAMES
from scheduler.dependencies import dependencies_settle
from scheduler.models import (
    Allocation,
    Gpu,
    Job,
    JobState,
    Node,
)
from scheduler.transitions import job_transition, jobs_changed, jobs_transition_bulk

log = logging.getLogger(__name__)

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
        min_gpu_memory_mib=row.min_gpu_memory_gb * 1000 * 1000 * 1000 // (1024 * 1024),
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
    """GPU-hours per project over the last week, halved every FAIR_SHARE_HALF_LIFE_H hours.

    `active` holds the active allocations, already read by the snapshot; only the allocations that ended within the week are read here.
    """
    usage: dict[int, float] = defaultdict(float)
    since = now - timedelta(days=7)
    now_s, since_s = ts(now), ts(since)
    rows: list[tuple[int, int, float, float]] = [
        (a.project_id, a.share_milli, a.started_s, now_s)
        for a in active
        if a.project_id in project_ids
    ]
    rows += reads.ENDED_ALLOCATIONS.rows(project_ids=list(project_ids), since=since)
    for project_id, share, started, end in rows:
        hours = max(0.0, end - max(started, since_s)) / 3600 * share / 1000
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
    now_s = ts(now)
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
    node_cpu: dict[int, int] = defaultdict(int)
    node_mem: dict[int, int] = defaultdict(int)
    running: list[RunningWork] = []
    project_ids: set[int] = set()
    reused, kept = _REUSE.running, {}  # see `_Reused`
    for job_id, allocs in by_job.items():
        job = allocs[0]  # the job's columns repeat on each of its allocation rows
        project_ids.add(job.project_id)
        if len(allocs) == 1:
            node_cpu[job.node_id] += job.job_cpu_milli
            node_mem[job.node_id] += job.job_memory_mib
            started_s = job.started_s
        else:
            per_node: dict[int, int] = defaultdict(int)
            for a in allocs:
                per_node[a.node_id] += 1
            for node_id, count in per_node.items():
                node_cpu[node_id] += job.job_cpu_milli * count // len(allocs)
                node_mem[node_id] += job.job_memory_mib * count // len(allocs)
            started_s = min(a.started_s for a in allocs)
        # Only running work is resized: a job starting, or stopping for a resize already in
        # flight, is not planned again; it grows only once past its minimum runtime.
        resizable = job.state == _RUNNING
        grows = resizable and now_s - started_s >= job.min_runtime_s
        key = (allocs, grows)
        known = reused.get(job_id)
        if known is not None and known[0] == key:
            work = known[1]
        else:
            work = RunningWork(
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
        kept[job_id] = (key, work)
        running.append(work)
    _REUSE.running = kept

    gpus_of: dict[int, list[GpuView]] = defaultdict(list)
    reused_gpus, kept_gpus = _REUSE.gpus, {}
    for g in reads.GPUS.rows():
        gpu_key = (g, used_milli[g.pk], used_mem[g.pk])
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
    node_views = [
        NodeView(
            node_id=n.pk,
            name=n.name,
            pool=n.pool,
            gpus=tuple(gpus_of[n.pk]),
            cpu_milli_free=max(0, n.cpu_milli - node_cpu[n.pk]),
            memory_mib_free=max(0, n.memory_mib - node_mem[n.pk]),
            labels=dict(n.labels),
            # Ready, not fenced, and its agent has spoken: work placed here will start.
            schedulable=n.state == Node.State.READY
            and not n.fenced
            and n.last_heartbeat_at is not None,
            unavailable=node_unavailable(n.state, n.fenced, n.last_heartbeat_at is not None),
        )
        for n in reads.NODES.rows()
    ]

    queued = reads.QUEUED_JOBS.rows()
    recent = now - timedelta(seconds=PREEMPTION_MEMORY_S)
    preempted_by: dict[int, set[int]] = defaultdict(set)
    for job_id, data in reads.RECENT_PREEMPTIONS.rows(since=recent):
        if isinstance(data, dict) and data.get("for_job"):
            preempted_by[job_id].add(int(data["for_job"]))
    decoded: dict[str, frozenset[str]] = {}
    none: frozenset[int] = frozenset()
    queue = []
    pending_now = {}
    project_of = {}
    for r in queued:
        text = r.precisions_json
        if text not in decoded:
            decoded[text] = frozenset(json.loads(text))
        models = r.gpu_models_json
        if models not in decoded:
            decoded[models] = frozenset(json.loads(models))
        pk = r.pk
        queue.append(
            job_request_from_row(
                r,
                decoded[text],
                frozenset(preempted_by[pk]) if pk in preempted_by else none,
                decoded[models],
            )
        )
        project_ids.add(r.project_id)
        project_of[pk] = r.project_id
        pending_now[pk] = (
            r.pending_reason,
            r.pending_message,
            r.queue_position,
            r.estimated_start_at,
        )
    for extra in extra_jobs or []:
        queue.append(job_request(extra))
        if extra.project_id:
            project_ids.add(extra.project_id)

    ids = list(project_ids)
    limits: dict[int, dict[str, int]] = defaultdict(dict)
    for project_id, model_name, max_gpus in reads.QUOTA_MODEL_LIMITS.rows(project_ids=ids):
        limits[project_id][model_name] = max_gpus
    over_budget = ports.BUDGET_GATE.get()(project_ids=project_ids)
    at_cap = ports.BUDGET_CAPPED.get()(project_ids=project_ids)
    reserved = ports.RESERVED_CAPACITY.get()(now=now)
    usage = _decayed_usage(project_ids, now, active) if with_usage else {}
    project_quotas = {
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
    model_precisions = {
        name: frozenset(precisions) for name, precisions in reads.MODEL_PRECISIONS.rows()
    }
    snapshot = Snapshot(
        nodes=tuple(node_views),
        running=tuple(running),
        quotas=project_quotas,
        model_precisions=model_precisions,
    )
    return CycleInput(
        snapshot=snapshot,
        queue=queue,
        pending_now=pending_now,
        holds=holds,
        project_of=project_of,
    )


def policy_config() -> PolicyConfig:
    """The first pool's policy (every pool is planned under it). A name the core does not know
    (written around the admin's choices) is refused with the names it does know."""
    for queue, scorer, backfill, preemption in reads.POOL_POLICY.rows():
        if queue not in QUEUE_POLICIES:
            raise ImproperlyConfigured(
                f"The pool's queue policy {queue!r} is unknown; choose one of "
                f"{', '.join(QUEUE_POLICIES)} (admin: Pools)."
            )
        if scorer not in SCORER_NAMES:
            raise ImproperlyConfigured(
                f"The pool's scorer {scorer!r} is unknown; choose one of "
                f"{', '.join(SCORER_NAMES)} (admin: Pools)."
            )
        return PolicyConfig(queue=queue, scorer=scorer, backfill=backfill, preemption=preemption)
    return PolicyConfig()


def orders_by_fair_share(config: PolicyConfig) -> bool:
    """Whether planning under `config` reads the projects' decayed usage."""
    return any(c.queue == "fairshare" for c in (config, *config.pools.values()))


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


def run_cycle(*, now: datetime | None = None) -> CycleResult:
    """One whole cycle: snapshot → plan → apply. Callers hold the single-flight lock.

    With nothing queued there is nothing to decide, so the snapshot is not read at all.
    """
    started = time.perf_counter()
    now = now or timezone.now()
    expire_stale_preemptions(now=now)
    queued = reads.queued_kinds()
    if "dependencies" in queued:
        settled = dependencies_settle()
        for job in Job.objects.filter(pk__in=settled.failed).select_related("pool"):
            if backends.is_external(job):
                backends.cancel(job)  # scancel what Slurm holds for a dependency never met
        if settled.released:
            queued = reads.queued_kinds()  # released jobs are planned (or handed over) now
    if "slurm" in queued:
        backends.handoff()  # queued jobs of Slurm pools go to Slurm (its scheduler places them)
    result = CycleResult()
    # Elastic work below its maximum may grow into idle GPUs even when nothing is queued.
    if "agents" in queued or "elastic" in queued:
        config = policy_config()
        state = build_state(now=now, with_usage=orders_by_fair_share(config))
        if state.queue or config.elastic:
            decided = plan(state.snapshot, state.queue, config, ts(now))
            result = apply_plan(decided, state, now=now)
            record_pending(decided, state, set(result.placed), result.waiting)
    result.seconds = time.perf_counter() - started
    return result


def apply_plan(decided: Plan, state: CycleInput, *, now: datetime) -> CycleResult:
    """Write the plan's placements and preemptions; drop a placement that no longer fits.

    Plain rows throughout (a big cycle places hundreds of jobs on thousands of GPUs): the
    allocations and the JobEvents go in as one multi-row INSERT each, the jobs in one UPDATE.
    A plan with neither (a blocked queue's usual cycle) opens no transaction.
    """
    if not decided.placements and not decided.preemptions and not decided.resizes:
        return CycleResult(pending=len(decided.pending))
    return _apply_plan_locked(decided, now=now, holds=state.holds, project_of=state.project_of)


@transaction.atomic
def _apply_plan_locked(
    decided: Plan,
    *,
    now: datetime,
    holds: dict[int, list[elastic.Held]],
    project_of: dict[int, int],
) -> CycleResult:
    result = CycleResult(pending=len(decided.pending))
    touched = sorted({s.gpu_id for p in decided.placements for s in p.shares})
    # Lock the GPU rows in a fixed order, then read what is allocated on them now.
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
    now = ended_since

    placing = {
        row.pk: row
        for row in reads.lock_queued_jobs(job_ids=[p.job_id for p in decided.placements])
    }
    # A shrink frees its GPUs only once the shrunk job has stopped: a placement on them waits
    # (with that reason) rather than being dropped and planned again unchanged next cycle.
    shrinking = {s.gpu_id: r for r in decided.resizes for s in r.release}
    new_allocations: list[tuple[Any, ...]] = []
    scheduled: list[tuple[Any, ...]] = []
    gang_nodes: list[tuple[int, int, list[tuple[int, int]]]] = []
    reasons: dict[int, str] = {}
    event_data: dict[int, dict[str, object]] = {}
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
            result.waiting[job_id] = (
                PendingReason.PREEMPTING.value,
                f"Starting soon: job {waits_for.job_id} is shrinking to {waits_for.gpus} GPUs "
                "to make room for it",
            )
            continue
        fits = True
        for s in placement.shares:
            gpu = locked.get(s.gpu_id)
            if (
                gpu is None
                or not gpu.usable
                or used[s.gpu_id] + s.milli > gpu.capacity_milli
                or used_mem[s.gpu_id] + s.memory_mib > gpu.memory_mib
            ):
                fits = False
                break
        if not fits:
            result.dropped.append(job_id)
            result.waiting[job_id] = (
                PendingReason.NO_CAPACITY.value,
                "Waiting for capacity: the GPUs planned for it were taken or became unusable "
                "before it could be placed; it is planned again on the current state",
            )
            continue
        attempt = row.attempt + 1
        borrowed = row.borrowed or placement.borrowed
        for s in placement.shares:
            gpu = locked[s.gpu_id]
            used[s.gpu_id] += s.milli
            used_mem[s.gpu_id] += s.memory_mib
            new_allocations.append(
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
                    now,
                    None,
                    "",
                )
            )
        per_node: dict[int, int] = {}
        for s in placement.shares:  # rank order: the order of the placement's nodes
            per_node[locked[s.gpu_id].node_id] = per_node.get(locked[s.gpu_id].node_id, 0) + 1
        gang_nodes.append((job_id, attempt, list(per_node.items())))
        # a placed job no longer waits: clear its reason, position and estimate
        scheduled.append((job_id, row.state, attempt, borrowed, "", "", None, None))
        nodes = sorted({locked[s.gpu_id].node_name for s in placement.shares})
        reasons[job_id] = f"Placed on {', '.join(nodes)}" + (
            " (borrowed, preemptible)" if placement.borrowed else ""
        )
        event_data[job_id] = {"gpus": [s.gpu_id for s in placement.shares], "attempt": attempt}
        result.placed.append(job_id)
    insert_rows(Allocation, Allocation.WRITTEN_FIELDS, new_allocations)
    ports_of = gangs.members_create(gang_nodes, now=now)
    scheduled = [(*row, ports_of.get(row[0])) for row in scheduled]
    jobs_transition_bulk(
        rows=scheduled,
        to=JobState.SCHEDULED,
        reasons=reasons,
        actor_label="scheduler",
        data=event_data,
        update_fields=(
            "attempt",
            "borrowed",
            "pending_reason",
            "pending_message",
            "queue_position",
            "estimated_start_at",
            "rendezvous_port",
        ),
        nodes_of={job_id: [node for node, _ in nodes] for job_id, _, nodes in gang_nodes},
        project_of=project_of,
    )

    for resize in decided.resizes:
        if elastic.resize_planned(resize, now=now):
            result.resized.append(resize.job_id)

    for preemption in decided.preemptions:
        victim = (
            Job.objects.select_for_update()
            .filter(
                pk=preemption.job_id,
                state__in=[JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING],
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
    return result


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


def expire_stale_preemptions(*, now: datetime) -> list[int]:
    """Preempting jobs whose agent never confirmed the stop: requeue them once well past grace.

    The node's agent kills anything the portal no longer assigns to it, so the GPUs are free.
    Most cycles find none, which one unlocked read tells without opening a transaction.
    """
    cutoff = now - timedelta(seconds=60)
    if not reads.OVERDUE_PREEMPTION.rows(cutoff=cutoff):
        return []
    return _requeue_overdue_preemptions(cutoff)


@transaction.atomic
def _requeue_overdue_preemptions(cutoff: datetime) -> list[int]:
    overdue = Job.objects.select_for_update().filter(
        state=JobState.PREEMPTING, preempt_deadline__lt=cutoff
    )
    requeued = []
    for job in overdue:
        if job.resize:  # a resize the node never confirmed: requeued at its new size
            elastic.resize_unconfirmed(job)
            requeued.append(job.pk)
            continue
        job.resume = bool(job.checkpoint_dir)
        job_transition(
            job=job,
            to=JobState.QUEUED,
            reason="Preemption grace period over without confirmation from the node; requeued",
            actor_label="scheduler",
            update_fields=("resume",),
        )
        requeued.append(job.pk)
    return requeued
