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
from django.db.models import F, Q, TextField
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from portal.db import AnyOf, CompiledQuery, EpochSeconds, bulk_update_rows, insert_rows
from scheduler import ports
from scheduler.core.model import (
    GpuView,
    JobRequest,
    NodeView,
    ProjectQuota,
    RunningWork,
    Share,
    Snapshot,
    gpu_capacity_milli,
)
from scheduler.core.plan import QUEUE_POLICIES, Plan, PolicyConfig, plan
from scheduler.core.scorers import SCORER_NAMES
from scheduler.models import (
    Allocation,
    Gpu,
    GpuModel,
    Job,
    JobEvent,
    JobState,
    Node,
    Pool,
    Quota,
    QuotaModelLimit,
)
from scheduler.transitions import job_transition, jobs_transition_bulk

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


def job_request(job: Job, *, preempted_by: frozenset[int] = frozenset()) -> JobRequest:
    """The core's view of a Job instance (the dry run's hypothetical job)."""
    return _request(
        (
            job.pk,
            job.project.slug,
            job.gpus,
            job.gpu_milli,
            job.gpu_memory_mib,
            job.nodes,
            job.gpus_per_node,
            job.gpu_model.name if job.gpu_model is not None else None,
            job.min_gpu_memory_gb,
            job.cpu_milli,
            job.memory_mib,
            job.priority,
            job.preemptible,
            job.borrowed,
            job.runtime_estimate_s,
            job.elastic_min,
            job.elastic_max,
            job.pool.name if job.pool is not None else None,
            ts(job.queued_at or job.created_at),
        ),
        frozenset(job.precisions),
        preempted_by,
    )


HOLDER_FIELDS = (
    "project_id",
    "project__slug",
    "priority",
    "preemptible",
    "borrowed",
    "state",
    "min_runtime_s",
    "runtime_estimate_s",
    "elastic_min",
    "elastic_max",
    "cpu_milli",
    "memory_mib",
)

# What the core needs of a queued job, in the order `_request` reads them (a plain row).
QUEUED_FIELDS = (
    "pk",
    "project__slug",
    "gpus",
    "gpu_milli",
    "gpu_memory_mib",
    "nodes",
    "gpus_per_node",
    "gpu_model__name",
    "min_gpu_memory_gb",
    "cpu_milli",
    "memory_mib",
    "priority",
    "preemptible",
    "borrowed",
    "runtime_estimate_s",
    "elastic_min",
    "elastic_max",
    "pool__name",
)


def _request(
    row: tuple[Any, ...], precisions: frozenset[str], preempted_by: frozenset[int]
) -> JobRequest:
    """A JobRequest from a row of QUEUED_FIELDS followed by the submission time (epoch s)."""
    (
        pk,
        project,
        gpus,
        gpu_milli,
        gpu_memory_mib,
        nodes,
        gpus_per_node,
        model,
        min_gpu_memory_gb,
        cpu_milli,
        memory_mib,
        priority,
        preemptible,
        borrowed,
        runtime_estimate_s,
        elastic_min,
        elastic_max,
        pool,
        submitted_at,
    ) = row[:19]
    return JobRequest(
        job_id=pk,
        project=project,
        submitted_at=submitted_at,
        gpus=gpus,
        gpu_milli=gpu_milli,
        gpu_memory_mib=gpu_memory_mib,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        models=frozenset({model}) if model else frozenset(),
        min_gpu_memory_mib=min_gpu_memory_gb * 1000 * 1000 * 1000 // (1024 * 1024),
        precisions=precisions,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        priority=priority,
        preemptible=preemptible or borrowed,
        runtime_estimate_s=runtime_estimate_s,
        elastic_min=elastic_min,
        elastic_max=elastic_max,
        pool=pool,
        preempted_by=preempted_by,
    )


# The snapshot's reads, compiled to SQL once (`CompiledQuery`): the cycle runs back to back
# while jobs arrive, and building these querysets cost more CPU than running them.
_ACTIVE_ALLOCATIONS = CompiledQuery(
    lambda: Allocation.objects.filter(ended_at__isnull=True).values_list(
        "job_id",
        "node_id",
        "gpu_id",
        "share_milli",
        "memory_mib",
        EpochSeconds("started_at"),
        *(f"job__{name}" for name in HOLDER_FIELDS),
    )
)
_NODES = CompiledQuery(
    lambda: (
        Node.objects.exclude(state__in=[Node.State.RETIRED, Node.State.LOST])
        .order_by("pk")
        .values_list(
            "pk",
            "name",
            "pool__name",
            "cpu_milli",
            "memory_mib",
            "labels",
            "state",
            "fenced",
            "last_heartbeat_at",
        )
    )
)
_GPUS = CompiledQuery(
    lambda: (
        Gpu.objects.exclude(node__state__in=[Node.State.RETIRED, Node.State.LOST])
        .order_by("node_id", "index")
        .values_list(
            "pk",
            "node_id",
            "index",
            "model__name",
            "memory_mib",
            "sharing_mode",
            "oversubscription",
            "health",
        )
    )
)
# Plain tuples: QUEUED_FIELDS, submission time, then what only `build_state` reads.
_QUEUED_JOBS = CompiledQuery(
    lambda: (
        Job.objects.filter(state=JobState.QUEUED)
        .order_by("queued_at", "pk")
        .values_list(
            *QUEUED_FIELDS,
            EpochSeconds(Coalesce("queued_at", "created_at")),
            # as text: decoded once per distinct value, most jobs ask for none
            Cast("precisions", output_field=TextField()),
            "project_id",
            "pending_reason",
            "pending_message",
            "queue_position",
            "estimated_start_at",
        )
    )
)
_RECENT_PREEMPTIONS = CompiledQuery(
    lambda since: JobEvent.objects.filter(
        job__state=JobState.QUEUED, to_state=JobState.PREEMPTING, created_at__gte=since
    ).values_list("job_id", "data")
)
_QUOTAS = CompiledQuery(
    lambda project_ids: Quota.objects.filter(AnyOf(F("project_id"), project_ids)).values_list(
        "project_id", "project__slug", "max_gpus", "allow_borrowing"
    )
)
_QUOTA_MODEL_LIMITS = CompiledQuery(
    lambda project_ids: QuotaModelLimit.objects.filter(
        AnyOf(F("quota__project_id"), project_ids)
    ).values_list("quota__project_id", "gpu_model__name", "max_gpus")
)
_MODEL_PRECISIONS = CompiledQuery(lambda: GpuModel.objects.values_list("name", "precisions"))
_ENDED_ALLOCATIONS = CompiledQuery(
    lambda project_ids, since: Allocation.objects.filter(
        AnyOf(F("job__project_id"), project_ids), ended_at__gte=since
    ).values_list(
        "job__project_id", "share_milli", EpochSeconds("started_at"), EpochSeconds("ended_at")
    )
)


def _decayed_usage(
    project_ids: set[int], now: datetime, active: list[tuple[int, int, float]]
) -> dict[int, float]:
    """GPU-hours per project over the last week, halved every FAIR_SHARE_HALF_LIFE_H hours.

    `active` holds the active allocations as (project id, share, start in epoch seconds),
    already read by the snapshot; only the allocations that ended within the week are read here.
    """
    usage: dict[int, float] = defaultdict(float)
    since = now - timedelta(days=7)
    now_s, since_s = ts(now), ts(since)
    rows: list[tuple[int, int, float, float]] = [
        (project_id, share, started, now_s)
        for project_id, share, started in active
        if project_id in project_ids
    ]
    rows += _ENDED_ALLOCATIONS.rows(project_ids=list(project_ids), since=since)
    for project_id, share, started, end in rows:
        hours = max(0.0, end - max(started, since_s)) / 3600 * share / 1000
        age_h = (now_s - end) / 3600
        usage[project_id] += hours * math.pow(0.5, age_h / FAIR_SHARE_HALF_LIFE_H)
    return usage


def build_state(
    *, now: datetime, extra_jobs: list[Job] | None = None, with_usage: bool = True
) -> CycleInput:
    """Read nodes, GPUs, active allocations, queued jobs and quotas into immutable core values.

    Plain rows, not model instances: the cycle reads tens of thousands of rows.
    `with_usage=False` leaves the projects' decayed usage at zero without reading the week's
    ended allocations; only the fair-share queue policy reads it (`orders_by_fair_share`).
    """
    # Active allocations with their job's columns in one read (consistent, no id list).
    active = _ACTIVE_ALLOCATIONS.rows()
    used_milli: dict[int, int] = defaultdict(int)
    used_mem: dict[int, int] = defaultdict(int)
    by_job: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    for row in active:
        used_milli[row[2]] += row[3]
        used_mem[row[2]] += row[4]
        by_job[row[0]].append(row)
    node_cpu: dict[int, int] = defaultdict(int)
    node_mem: dict[int, int] = defaultdict(int)
    running: list[RunningWork] = []
    project_ids: set[int] = set()
    for job_id, allocs in by_job.items():
        # the job's columns (HOLDER_FIELDS) repeat on each of its allocation rows
        (
            project_id,
            project,
            priority,
            preemptible,
            borrowed,
            state,
            min_runtime_s,
            runtime_estimate_s,
            elastic_min,
            elastic_max,
            cpu_milli,
            memory_mib,
        ) = allocs[0][6:]
        project_ids.add(project_id)
        per_node: dict[int, int] = defaultdict(int)
        for a in allocs:
            per_node[a[1]] += 1
        for node_id, count in per_node.items():
            node_cpu[node_id] += cpu_milli * count // len(allocs)
            node_mem[node_id] += memory_mib * count // len(allocs)
        running.append(
            RunningWork(
                job_id=job_id,
                project=project,
                priority=priority,
                preemptible=(preemptible or borrowed) and state != JobState.PREEMPTING,
                started_at=min(a[5] for a in allocs),
                min_runtime_s=min_runtime_s,
                runtime_estimate_s=runtime_estimate_s,
                shares=tuple(
                    Share(node_id=a[1], gpu_id=a[2], milli=a[3], memory_mib=a[4]) for a in allocs
                ),
                elastic_min=elastic_min,
                elastic_max=elastic_max,
                borrowed=borrowed,
                cpu_milli=cpu_milli,
                memory_mib=memory_mib,
            )
        )

    nodes = _NODES.rows()
    gpus_of: dict[int, list[GpuView]] = defaultdict(list)
    for gid, node_id, index, model, mem, sharing, factor, health in _GPUS.rows():
        gpus_of[node_id].append(
            GpuView(
                gpu_id=gid,
                index=index,
                model=model,
                memory_mib=mem,
                capacity_milli=gpu_capacity_milli(sharing, factor),
                used_milli=used_milli[gid],
                used_memory_mib=used_mem[gid],
                sharing=sharing,
                healthy=health != Gpu.Health.UNHEALTHY,
            )
        )
    node_views = [
        NodeView(
            node_id=pk,
            name=name,
            pool=pool,
            gpus=tuple(gpus_of[pk]),
            cpu_milli_free=max(0, cpu - node_cpu[pk]),
            memory_mib_free=max(0, mem - node_mem[pk]),
            labels=dict(labels),
            # Ready, not fenced, and its agent has spoken: work placed here will start.
            schedulable=state == Node.State.READY and not fenced and heartbeat is not None,
        )
        for pk, name, pool, cpu, mem, labels, state, fenced, heartbeat in nodes
    ]

    queued = _QUEUED_JOBS.rows()
    recent = now - timedelta(seconds=PREEMPTION_MEMORY_S)
    preempted_by: dict[int, set[int]] = defaultdict(set)
    for job_id, data in _RECENT_PREEMPTIONS.rows(since=recent):
        if isinstance(data, dict) and data.get("for_job"):
            preempted_by[job_id].add(int(data["for_job"]))
    decoded: dict[str, frozenset[str]] = {}
    none: frozenset[int] = frozenset()
    queue = []
    pending_now = {}
    for r in queued:
        text = r[19]
        if text not in decoded:
            decoded[text] = frozenset(json.loads(text))
        pk = r[0]
        queue.append(
            _request(r, decoded[text], frozenset(preempted_by[pk]) if pk in preempted_by else none)
        )
        project_ids.add(r[20])
        pending_now[pk] = (r[21], r[22], r[23], r[24])
    for extra in extra_jobs or []:
        queue.append(job_request(extra))
        if extra.project_id:
            project_ids.add(extra.project_id)

    ids = list(project_ids)
    limits: dict[int, dict[str, int]] = defaultdict(dict)
    for project_id, model_name, max_gpus in _QUOTA_MODEL_LIMITS.rows(project_ids=ids):
        limits[project_id][model_name] = max_gpus
    over_budget = ports.BUDGET_GATE.get()(project_ids=project_ids)
    reserved = ports.RESERVED_CAPACITY.get()(now=now)
    usage = (
        _decayed_usage(project_ids, now, [(a[6], a[3], a[5]) for a in active]) if with_usage else {}
    )
    project_quotas = {
        slug: ProjectQuota(
            max_gpus=max_gpus,
            max_gpus_per_model=limits.get(project_id, {}),
            allow_borrowing=allow_borrowing,
            budget_exhausted=project_id in over_budget,
            decayed_usage=usage.get(project_id, 0.0),
            reserved=reserved.get(slug, {}),
        )
        for project_id, slug, max_gpus, allow_borrowing in _QUOTAS.rows(project_ids=ids)
    }
    model_precisions = {
        name: frozenset(precisions) for name, precisions in _MODEL_PRECISIONS.rows()
    }
    snapshot = Snapshot(
        nodes=tuple(node_views),
        running=tuple(running),
        quotas=project_quotas,
        model_precisions=model_precisions,
    )
    return CycleInput(snapshot=snapshot, queue=queue, pending_now=pending_now)


_POOL_POLICY = CompiledQuery(
    lambda: Pool.objects.order_by("pk").values_list(
        "queue_policy", "scorer", "backfill", "preemption"
    )[:1]
)


def policy_config() -> PolicyConfig:
    """The first pool's policy (every pool is planned under it). A name the core does not know
    (written around the admin's choices) is refused with the names it does know."""
    for queue, scorer, backfill, preemption in _POOL_POLICY.rows():
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
    pending: int = 0
    seconds: float = 0.0


_ANY_QUEUED = CompiledQuery(lambda: Job.objects.filter(state=JobState.QUEUED).values_list("pk")[:1])


def run_cycle(*, now: datetime | None = None) -> CycleResult:
    """One whole cycle: snapshot → plan → apply. Callers hold the single-flight lock.

    With nothing queued there is nothing to decide, so the snapshot is not read at all.
    """
    started = time.perf_counter()
    now = now or timezone.now()
    expire_stale_preemptions(now=now)
    result = CycleResult()
    if _ANY_QUEUED.rows():
        config = policy_config()
        state = build_state(now=now, with_usage=orders_by_fair_share(config))
        if state.queue:
            decided = plan(state.snapshot, state.queue, config, ts(now))
            result = apply_plan(decided, state, now=now)
            record_pending(decided, state, set(result.placed))
    result.seconds = time.perf_counter() - started
    return result


ALLOCATION_FIELDS = (
    "job",
    "gpu",
    "node",
    "attempt",
    "share_milli",
    "memory_mib",
    "gpu_model",
    "borrowed",
    "started_at",
    "ended_at",
    "end_reason",
)


# `apply_plan`'s reads under its locks, compiled once like the snapshot's.
_LOCK_GPUS = CompiledQuery(
    lambda gpu_ids: (
        Gpu.objects.select_for_update(of=("self",))
        .filter(AnyOf(F("pk"), gpu_ids))
        .order_by("pk")
        .values_list(
            "pk",
            "node_id",
            "node__name",
            "node__state",
            "node__fenced",
            "model_id",
            "health",
            "sharing_mode",
            "oversubscription",
            "memory_mib",
        )
    )
)
# What holds the GPUs now, and what ended on them after `now` (ended_at set).
_ALLOCATIONS_ON_GPUS = CompiledQuery(
    lambda gpu_ids, now: (
        Allocation.objects.filter(AnyOf(F("gpu_id"), gpu_ids))
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=now))
        .values_list("gpu_id", "share_milli", "memory_mib", "ended_at")
    )
)
_LOCK_QUEUED_JOBS = CompiledQuery(
    lambda job_ids: (
        Job.objects.select_for_update(of=("self",))
        .filter(AnyOf(F("pk"), job_ids), state=JobState.QUEUED)
        .order_by("pk")
        .values_list("pk", "attempt", "borrowed", "state")
    )
)


def apply_plan(decided: Plan, state: CycleInput, *, now: datetime) -> CycleResult:
    """Write the plan's placements and preemptions; drop a placement that no longer fits.

    Plain rows throughout (a big cycle places hundreds of jobs on thousands of GPUs): the
    allocations and the JobEvents go in as one multi-row INSERT each, the jobs in one UPDATE.
    A plan with neither (a blocked queue's usual cycle) opens no transaction.
    """
    if not decided.placements and not decided.preemptions:
        return CycleResult(pending=len(decided.pending))
    return _apply_plan_locked(decided, now=now)


@transaction.atomic
def _apply_plan_locked(decided: Plan, *, now: datetime) -> CycleResult:
    result = CycleResult(pending=len(decided.pending))
    touched = sorted({s.gpu_id for p in decided.placements for s in p.shares})
    # Lock the GPU rows in a fixed order, then read what is allocated on them now.
    locked: dict[int, _LockedGpu] = {}
    for gpu_row in _LOCK_GPUS.rows(gpu_ids=touched):
        pk, node_id, name, node_state, fenced, model_id, health, sharing, factor, memory = gpu_row
        locked[pk] = _LockedGpu(
            node_id=node_id,
            node_name=name,
            usable=health != Gpu.Health.UNHEALTHY and node_state == Node.State.READY and not fenced,
            model_id=model_id,
            capacity_milli=gpu_capacity_milli(sharing, factor),
            memory_mib=memory,
        )
    used: dict[int, int] = defaultdict(int)
    used_mem: dict[int, int] = defaultdict(int)
    # The cycle's `now` was read before its snapshot: a job that ended after that instant (and
    # so freed its GPU for this plan) must not overlap the allocation that follows it.
    ended_since = now
    for gpu_id, share, mem, ended_at in _ALLOCATIONS_ON_GPUS.rows(gpu_ids=touched, now=now):
        if ended_at is None:
            used[gpu_id] += share
            used_mem[gpu_id] += mem
        else:
            ended_since = max(ended_since, ended_at)
    now = ended_since

    placing = {
        pk: (attempt, borrowed, job_state)
        for pk, attempt, borrowed, job_state in _LOCK_QUEUED_JOBS.rows(
            job_ids=[p.job_id for p in decided.placements]
        )
    }
    new_allocations: list[tuple[Any, ...]] = []
    scheduled: list[tuple[Any, ...]] = []
    reasons: dict[int, str] = {}
    event_data: dict[int, dict[str, object]] = {}
    for placement in decided.placements:
        job_id = placement.job_id
        row = placing.get(job_id)
        if row is None:
            result.dropped.append(job_id)
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
            continue
        attempt = row[0] + 1
        borrowed = row[1] or placement.borrowed
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
                    gpu.model_id,
                    borrowed,
                    now,
                    None,
                    "",
                )
            )
        # a placed job no longer waits: clear its reason, position and estimate
        scheduled.append((job_id, row[2], attempt, borrowed, "", "", None, None))
        nodes = sorted({locked[s.gpu_id].node_name for s in placement.shares})
        reasons[job_id] = f"Placed on {', '.join(nodes)}" + (
            " (borrowed, preemptible)" if placement.borrowed else ""
        )
        event_data[job_id] = {"gpus": [s.gpu_id for s in placement.shares], "attempt": attempt}
        result.placed.append(job_id)
    insert_rows(Allocation, ALLOCATION_FIELDS, new_allocations)
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
        ),
    )

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


def record_pending(decided: Plan, state: CycleInput, placed: set[int]) -> int:
    """Write why each unplaced job waits. Advisory, so it never waits for a lock: a job that
    another transaction holds right now keeps its old reason until the next cycle."""
    changed: dict[int, tuple[str, str, int | None, datetime | None]] = {}
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
    return bulk_update_rows(
        Job,
        ["pending_reason", "pending_message", "queue_position", "estimated_start_at"],
        [(pk, *new) for pk, new in changed.items()],
        skip_locked_where={"state": JobState.QUEUED},
    )


_OVERDUE_PREEMPTION = CompiledQuery(
    lambda cutoff: Job.objects.filter(
        state=JobState.PREEMPTING, preempt_deadline__lt=cutoff
    ).values_list("pk")[:1]
)


def expire_stale_preemptions(*, now: datetime) -> list[int]:
    """Preempting jobs whose agent never confirmed the stop: requeue them once well past grace.

    The node's agent kills anything the portal no longer assigns to it, so the GPUs are free.
    Most cycles find none, which one unlocked read tells without opening a transaction.
    """
    cutoff = now - timedelta(seconds=60)
    if not _OVERDUE_PREEMPTION.rows(cutoff=cutoff):
        return []
    return _requeue_overdue_preemptions(cutoff)


@transaction.atomic
def _requeue_overdue_preemptions(cutoff: datetime) -> list[int]:
    overdue = Job.objects.select_for_update().filter(
        state=JobState.PREEMPTING, preempt_deadline__lt=cutoff
    )
    requeued = []
    for job in overdue:
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
