"""The scheduling cycle: snapshot the database, plan in the pure core, apply in one transaction.

`apply` locks every GPU row a placement touches and re-checks capacity against the active
allocations it then sees, so no GPU is ever over-allocated, whatever runs concurrently.
A placement that no longer fits is dropped and retried on the next cycle.
"""

from __future__ import annotations

import logging
import math
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import UTC as _UTC
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone

from portal.db import bulk_update_fast
from portal.models import Quota
from scheduler import hooks
from scheduler.core.model import (
    GpuView,
    JobRequest,
    NodeView,
    ProjectQuota,
    RunningWork,
    Share,
    Snapshot,
)
from scheduler.core.plan import Plan, PolicyConfig, plan
from scheduler.models import (
    Allocation,
    Gpu,
    GpuModel,
    Job,
    JobEvent,
    JobState,
    Node,
    Pool,
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
class ClusterState:
    """The snapshot plus what `apply` needs to map the plan back to rows."""

    snapshot: Snapshot
    queue: list[JobRequest]
    jobs: dict[int, Job]
    gpus: dict[int, Gpu] = field(default_factory=dict)


def job_request(job: Job, *, preempted_by: frozenset[int] = frozenset()) -> JobRequest:
    """The core's view of a job."""
    submitted = job.queued_at or job.created_at
    return JobRequest(
        job_id=job.pk,
        project=job.project.slug,
        submitted_at=ts(submitted),
        gpus=job.gpus,
        gpu_milli=job.gpu_milli,
        gpu_memory_mib=job.gpu_memory_mib,
        nodes=job.nodes,
        gpus_per_node=job.gpus_per_node,
        models=frozenset({job.gpu_model.name}) if job.gpu_model is not None else frozenset(),
        min_gpu_memory_mib=job.min_gpu_memory_gb * 1000 * 1000 * 1000 // (1024 * 1024),
        precisions=frozenset(job.precisions),
        cpu_milli=job.cpu_milli,
        memory_mib=job.memory_mib,
        priority=job.priority,
        preemptible=job.preemptible or job.borrowed,
        runtime_estimate_s=job.runtime_estimate_s,
        elastic_min=job.elastic_min,
        elastic_max=job.elastic_max,
        pool=job.pool.name if job.pool is not None else None,
        preempted_by=preempted_by,
    )


def _decayed_usage(project_ids: list[int], now: datetime) -> dict[int, float]:
    """GPU-hours per project over the last week, halved every FAIR_SHARE_HALF_LIFE_H hours."""
    usage: dict[int, float] = defaultdict(float)
    since = now - timedelta(days=7)
    rows = (
        Allocation.objects.filter(job__project_id__in=project_ids)
        .exclude(ended_at__lt=since)
        .values_list("job__project_id", "share_milli", "started_at", "ended_at")
    )
    for project_id, share, started, ended in rows:
        end = ended or now
        hours = max(0.0, (end - max(started, since)).total_seconds()) / 3600 * share / 1000
        age_h = (now - end).total_seconds() / 3600
        usage[project_id] += hours * math.pow(0.5, age_h / FAIR_SHARE_HALF_LIFE_H)
    return usage


def build_state(*, now: datetime, extra_jobs: list[Job] | None = None) -> ClusterState:
    """Read nodes, GPUs, active allocations, queued jobs and quotas into immutable core values."""
    nodes = list(
        Node.objects.exclude(state__in=[Node.State.RETIRED, Node.State.LOST])
        .select_related("pool")
        .prefetch_related(Prefetch("gpus", queryset=Gpu.objects.select_related("model")))
        .order_by("pk")
    )
    active = list(
        Allocation.objects.filter(ended_at__isnull=True).select_related("job", "job__project")
    )
    used_milli: dict[int, int] = defaultdict(int)
    used_mem: dict[int, int] = defaultdict(int)
    by_job: dict[int, list[Allocation]] = defaultdict(list)
    for alloc in active:
        used_milli[alloc.gpu_id] += alloc.share_milli
        used_mem[alloc.gpu_id] += alloc.memory_mib
        by_job[alloc.job_id].append(alloc)

    node_cpu: dict[int, int] = defaultdict(int)
    node_mem: dict[int, int] = defaultdict(int)
    running: list[RunningWork] = []
    jobs: dict[int, Job] = {}
    for job_id, allocs in by_job.items():
        job = allocs[0].job
        jobs[job_id] = job
        per_node: dict[int, int] = defaultdict(int)
        for a in allocs:
            per_node[a.node_id] += 1
        for node_id, count in per_node.items():
            node_cpu[node_id] += job.cpu_milli * count // len(allocs)
            node_mem[node_id] += job.memory_mib * count // len(allocs)
        running.append(
            RunningWork(
                job_id=job_id,
                project=job.project.slug,
                priority=job.priority,
                preemptible=(job.preemptible or job.borrowed) and job.state != JobState.PREEMPTING,
                started_at=ts(min(a.started_at for a in allocs)),
                min_runtime_s=job.min_runtime_s,
                runtime_estimate_s=job.runtime_estimate_s,
                shares=tuple(
                    Share(
                        node_id=a.node_id,
                        gpu_id=a.gpu_id,
                        milli=a.share_milli,
                        memory_mib=a.memory_mib,
                    )
                    for a in allocs
                ),
                elastic_min=job.elastic_min,
                elastic_max=job.elastic_max,
                borrowed=job.borrowed,
                cpu_milli=job.cpu_milli,
                memory_mib=job.memory_mib,
            )
        )

    gpus: dict[int, Gpu] = {}
    node_views = []
    for node in nodes:
        views = []
        for gpu in node.gpus.all():
            gpus[gpu.pk] = gpu
            views.append(
                GpuView(
                    gpu_id=gpu.pk,
                    index=gpu.index,
                    model=gpu.model.name,
                    memory_mib=gpu.memory_mib,
                    capacity_milli=gpu.capacity_milli,
                    used_milli=used_milli[gpu.pk],
                    used_memory_mib=used_mem[gpu.pk],
                    sharing=gpu.sharing_mode,
                    healthy=gpu.health != Gpu.Health.UNHEALTHY,
                )
            )
        node_views.append(
            NodeView(
                node_id=node.pk,
                name=node.name,
                pool=node.pool.name,
                gpus=tuple(views),
                cpu_milli_free=max(0, node.cpu_milli - node_cpu[node.pk]),
                memory_mib_free=max(0, node.memory_mib - node_mem[node.pk]),
                labels=dict(node.labels),
                # Ready, not fenced, and its agent has spoken: work placed here will start.
                schedulable=node.state == Node.State.READY
                and not node.fenced
                and node.last_heartbeat_at is not None,
            )
        )

    queued = list(
        Job.objects.filter(state=JobState.QUEUED)
        .select_related("project", "gpu_model", "pool")
        .order_by("queued_at", "pk")
    )
    queued += extra_jobs or []
    recent = now - timedelta(seconds=PREEMPTION_MEMORY_S)
    preempted_by: dict[int, set[int]] = defaultdict(set)
    for job_id, data in JobEvent.objects.filter(
        job__in=[j.pk for j in queued if j.pk], to_state=JobState.PREEMPTING, created_at__gte=recent
    ).values_list("job_id", "data"):
        if isinstance(data, dict) and data.get("for_job"):
            preempted_by[job_id].add(int(data["for_job"]))
    queue = [job_request(j, preempted_by=frozenset(preempted_by[j.pk])) for j in queued]
    for j in queued:
        jobs[j.pk] = j

    project_ids = {j.project_id for j in jobs.values()}
    quotas = (
        Quota.objects.filter(project_id__in=project_ids)
        .select_related("project")
        .prefetch_related("model_limits__gpu_model")
    )
    over_budget = hooks.projects_over_budget(project_ids)
    reserved = hooks.reserved_gpus_by_project(now)
    usage = _decayed_usage(list(project_ids), now)
    project_quotas = {
        q.project.slug: ProjectQuota(
            max_gpus=q.max_gpus,
            max_gpus_per_model={lim.gpu_model.name: lim.max_gpus for lim in q.model_limits.all()},
            allow_borrowing=q.allow_borrowing,
            budget_exhausted=q.project_id in over_budget,
            decayed_usage=usage.get(q.project_id, 0.0),
            reserved=reserved.get(q.project.slug, {}),
        )
        for q in quotas
    }
    model_precisions = {
        m.name: frozenset(m.precisions) for m in GpuModel.objects.only("name", "precisions")
    }
    snapshot = Snapshot(
        nodes=tuple(node_views),
        running=tuple(running),
        quotas=project_quotas,
        model_precisions=model_precisions,
    )
    return ClusterState(snapshot=snapshot, queue=queue, jobs=jobs, gpus=gpus)


def policy_config() -> PolicyConfig:
    pool = Pool.objects.order_by("pk").first()
    if pool is None:
        return PolicyConfig()
    return PolicyConfig(
        queue=pool.queue_policy,
        scorer=pool.scorer,
        backfill=pool.backfill,
        preemption=pool.preemption,
    )


@dataclass
class CycleResult:
    placed: list[int] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    pending: int = 0
    seconds: float = 0.0


def run_cycle(*, now: datetime | None = None) -> CycleResult:
    """One whole cycle: snapshot → plan → apply. Callers hold the single-flight lock."""
    started = time.perf_counter()
    now = now or timezone.now()
    expire_stale_preemptions(now=now)
    state = build_state(now=now)
    result = CycleResult()
    if state.queue:
        decided = plan(state.snapshot, state.queue, policy_config(), ts(now))
        result = apply_plan(decided, state, now=now)
        record_pending(decided, state, set(result.placed))
    result.seconds = time.perf_counter() - started
    return result


@transaction.atomic
def apply_plan(decided: Plan, state: ClusterState, *, now: datetime) -> CycleResult:
    result = CycleResult()
    touched = sorted({s.gpu_id for p in decided.placements for s in p.shares})
    # Lock the GPU rows in a fixed order, then read what is allocated on them now.
    locked = {
        g.pk: g
        for g in Gpu.objects.select_for_update(of=("self",))
        .filter(pk__in=touched)
        .select_related("node", "model")
        .order_by("pk")
    }
    used: dict[int, int] = defaultdict(int)
    used_mem: dict[int, int] = defaultdict(int)
    for gpu_id, share, mem in Allocation.objects.filter(
        gpu_id__in=touched, ended_at__isnull=True
    ).values_list("gpu_id", "share_milli", "memory_mib"):
        used[gpu_id] += share
        used_mem[gpu_id] += mem

    placing = {
        j.pk: j
        for j in Job.objects.select_for_update(of=("self",))
        .filter(pk__in=[p.job_id for p in decided.placements], state=JobState.QUEUED)
        .order_by("pk")
    }
    new_allocations: list[Allocation] = []
    scheduled: list[Job] = []
    reasons: dict[int, str] = {}
    event_data: dict[int, dict[str, object]] = {}
    for placement in decided.placements:
        job = placing.get(placement.job_id)
        if job is None:
            result.dropped.append(placement.job_id)
            continue
        fits = all(
            s.gpu_id in locked
            and locked[s.gpu_id].health != Gpu.Health.UNHEALTHY
            and locked[s.gpu_id].node.state == Node.State.READY
            and not locked[s.gpu_id].node.fenced
            and used[s.gpu_id] + s.milli <= locked[s.gpu_id].capacity_milli
            and used_mem[s.gpu_id] + s.memory_mib <= locked[s.gpu_id].memory_mib
            for s in placement.shares
        )
        if not fits:
            result.dropped.append(job.pk)
            continue
        job.attempt += 1
        job.borrowed = job.borrowed or placement.borrowed
        for s in placement.shares:
            used[s.gpu_id] += s.milli
            used_mem[s.gpu_id] += s.memory_mib
            new_allocations.append(
                Allocation(
                    job=job,
                    gpu_id=s.gpu_id,
                    node_id=locked[s.gpu_id].node_id,
                    attempt=job.attempt,
                    share_milli=s.milli,
                    memory_mib=s.memory_mib,
                    gpu_model_id=locked[s.gpu_id].model_id,
                    borrowed=job.borrowed,
                    started_at=now,
                )
            )
        job.pending_reason = job.pending_message = ""
        job.queue_position = None
        job.estimated_start_at = None
        nodes = sorted({locked[s.gpu_id].node.name for s in placement.shares})
        reasons[job.pk] = f"Placed on {', '.join(nodes)}" + (
            " (borrowed, preemptible)" if placement.borrowed else ""
        )
        event_data[job.pk] = {"gpus": [s.gpu_id for s in placement.shares], "attempt": job.attempt}
        scheduled.append(job)
        result.placed.append(job.pk)
    Allocation.objects.bulk_create(new_allocations)
    jobs_transition_bulk(
        jobs=scheduled,
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

    result.pending = len(decided.pending)
    return result


def record_pending(decided: Plan, state: ClusterState, placed: set[int]) -> int:
    """Write why each unplaced job waits. Advisory, so it never waits for a lock: a job that
    another transaction holds right now keeps its old reason until the next cycle."""
    changed = {}
    for job_id, pending in decided.pending.items():
        job = state.jobs.get(job_id)
        if job is None or job_id in placed or job_id < 0:
            continue
        estimated = from_ts(pending.estimated_start) if pending.estimated_start else None
        new = (pending.reason.value, pending.message[:500], pending.position, estimated)
        old = (job.pending_reason, job.pending_message, job.queue_position, job.estimated_start_at)
        if new != old:
            job.pending_reason, job.pending_message, job.queue_position, job.estimated_start_at = (
                new
            )
            changed[job_id] = job
    if not changed:
        return 0
    with transaction.atomic():
        free = set(
            Job.objects.select_for_update(skip_locked=True)
            .filter(pk__in=list(changed), state=JobState.QUEUED)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        rows = [changed[pk] for pk in sorted(free)]
        return bulk_update_fast(
            Job, rows, ["pending_reason", "pending_message", "queue_position", "estimated_start_at"]
        )


@transaction.atomic
def expire_stale_preemptions(*, now: datetime) -> list[int]:
    """Preempting jobs whose agent never confirmed the stop: requeue them once well past grace.

    The node's agent kills anything the portal no longer assigns to it, so the GPUs are free.
    """
    overdue = Job.objects.select_for_update().filter(
        state=JobState.PREEMPTING, preempt_deadline__lt=now - timedelta(seconds=60)
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
