"""Fast path: the scheduling cycle's reads, compiled to SQL once, as named rows.

Justified by `bench.fast_paths` (docs/benchmarks.md, "Fast paths: kept or removed (issue 26)":
each read against the ORM's way; at `bench.submit_throughput`'s fleet of 25 nodes the snapshot's
reads are 1.9x to 4.3x, the small reads 1.9x to 4.6x at 10,000 jobs on 1,000 nodes, where the
snapshot's big reads are at par) and `bench.cycle_scale`. The cycle runs back to back while jobs
arrive, and building and compiling these querysets costs more CPU than PostgreSQL spends
answering them on a small fleet; tens of thousands of plain rows are also far cheaper than as
many model instances. Every read is an ordinary `values_list` queryset
(`foundation.db.CompiledQuery`; on SQLite it simply runs as one), and every row is a
`NamedTuple` whose fields are the selected columns in order, so a new column is added in two
lines next to each other. The placed jobs' lock (`lock_queued_jobs`) measured below 1.5x and is
a plain queryset; everything else in the cycle uses the ORM.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple

from django.db import connection
from django.db.models import CharField, F, Q, QuerySet, TextField, Value
from django.db.models.functions import Cast, Coalesce

from foundation.db import AnyOf, CompiledQuery, EpochSeconds
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

_GONE = [Node.State.RETIRED, Node.State.LOST]


class ActiveAllocationRow(NamedTuple):
    """An active allocation with its job's columns (repeated on each of the job's rows)."""

    job_id: int
    node_id: int
    gpu_id: int
    share_milli: int
    memory_mib: int
    started_s: float
    project_id: int
    project_slug: str
    priority: int
    preemptible: bool
    borrowed: bool
    state: str
    min_runtime_s: int
    runtime_estimate_s: int | None
    time_limit_s: int | None
    elastic_min: int | None
    elastic_max: int | None
    job_cpu_milli: int
    job_memory_mib: int
    # the GPU's sharing, for the part of it the share holds (`device_share_milli`)
    gpu_sharing_mode: str
    gpu_oversubscription: int


ACTIVE_ALLOCATIONS = CompiledQuery(
    lambda: Allocation.objects.filter(ended_at__isnull=True).values_list(
        "job_id",
        "node_id",
        "gpu_id",
        "share_milli",
        "memory_mib",
        EpochSeconds("started_at"),
        "job__project_id",
        "job__project__slug",
        "job__priority",
        "job__preemptible",
        "job__borrowed",
        "job__state",
        "job__min_runtime_s",
        "job__runtime_estimate_s",
        "job__time_limit_s",
        "job__elastic_min",
        "job__elastic_max",
        "job__cpu_milli",
        "job__memory_mib",
        "gpu__sharing_mode",
        "gpu__oversubscription",
    ),
    row=ActiveAllocationRow,
)


class ResizeHoldRow(NamedTuple):
    """A grow in flight and the idle GPUs held for it (`Job.resize["hold"]`)."""

    job_id: int
    resize: dict[str, Any]


RESIZE_HOLDS = CompiledQuery(
    lambda: Job.objects.filter(state=JobState.PREEMPTING, resize__has_key="hold").values_list(
        "pk", "resize"
    ),
    row=ResizeHoldRow,
)


class NodeRow(NamedTuple):
    pk: int
    name: str
    pool: str
    cpu_milli: int
    memory_mib: int
    labels: dict[str, str]
    state: str
    fenced: bool
    last_heartbeat_at: datetime | None


NODES = CompiledQuery(
    lambda: (
        Node.objects.exclude(state__in=_GONE)
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
    ),
    row=NodeRow,
)


class GpuRow(NamedTuple):
    pk: int
    node_id: int
    gpu_index: int  # `index` is a tuple method
    model: str
    memory_mib: int
    sharing_mode: str
    oversubscription: int
    health: str


GPUS = CompiledQuery(
    lambda: (
        Gpu.objects.exclude(node__state__in=_GONE)
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
    ),
    row=GpuRow,
)


class QueuedJobRow(NamedTuple):
    """What the core needs of a queued job (`cycle.job_request_from_row`), then what only
    `build_state` reads."""

    pk: int
    project_slug: str
    gpus: int
    gpu_milli: int
    gpu_memory_mib: int
    nodes: int | None
    gpus_per_node: int | None
    gpu_model: str | None
    min_gpu_memory_gb: int
    cpu_milli: int
    memory_mib: int
    priority: int
    preemptible: bool
    borrowed: bool
    runtime_estimate_s: int | None
    time_limit_s: int | None
    elastic_min: int | None
    elastic_max: int | None
    pool: str | None
    submitted_s: float
    precisions_json: str  # as text: decoded once per distinct value, most jobs ask for none
    project_id: int
    pending_reason: str
    pending_message: str
    queue_position: int | None
    estimated_start_at: datetime | None
    gpu_models_json: str  # as text, like precisions: the any-of model set of a manifest job
    volumes_json: str  # as text: most jobs mount none ("[]"), decoded only when some
    checkpoint: str


QUEUED_JOBS = CompiledQuery(
    lambda: (
        Job.objects.filter(state=JobState.QUEUED, waiting_on_dependencies=False)
        .exclude(pool__backend=Pool.Backend.SLURM)  # Slurm's jobs are handed over, not planned
        .order_by("queued_at", "pk")
        .values_list(
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
            "time_limit_s",
            "elastic_min",
            "elastic_max",
            "pool__name",
            EpochSeconds(Coalesce("queued_at", "created_at")),
            Cast("precisions", output_field=TextField()),
            "project_id",
            "pending_reason",
            "pending_message",
            "queue_position",
            "estimated_start_at",
            Cast("gpu_models", output_field=TextField()),
            Cast("volumes", output_field=TextField()),
            "checkpoint",
        )
    ),
    row=QueuedJobRow,
)


class PreemptionRow(NamedTuple):
    job_id: int
    data: Any


RECENT_PREEMPTIONS = CompiledQuery(
    lambda since: JobEvent.objects.filter(
        job__state=JobState.QUEUED, to_state=JobState.PREEMPTING, created_at__gte=since
    ).values_list("job_id", "data"),
    row=PreemptionRow,
)


class QuotaRow(NamedTuple):
    project_id: int
    project_slug: str
    max_gpus: int | None
    allow_borrowing: bool


QUOTAS = CompiledQuery(
    lambda project_ids: Quota.objects.filter(AnyOf(F("project_id"), project_ids)).values_list(
        "project_id", "project__slug", "max_gpus", "allow_borrowing"
    ),
    row=QuotaRow,
)


class QuotaModelLimitRow(NamedTuple):
    project_id: int
    model: str
    max_gpus: int


QUOTA_MODEL_LIMITS = CompiledQuery(
    lambda project_ids: QuotaModelLimit.objects.filter(
        AnyOf(F("quota__project_id"), project_ids)
    ).values_list("quota__project_id", "gpu_model__name", "max_gpus"),
    row=QuotaModelLimitRow,
)


class ModelPrecisionsRow(NamedTuple):
    name: str
    precisions: list[str]


MODEL_PRECISIONS = CompiledQuery(
    lambda: GpuModel.objects.values_list("name", "precisions"), row=ModelPrecisionsRow
)


class EndedAllocationRow(NamedTuple):
    project_id: int
    share_milli: int
    started_s: float
    ended_s: float
    gpu_sharing_mode: str
    gpu_oversubscription: int


ENDED_ALLOCATIONS = CompiledQuery(
    lambda project_ids, since: Allocation.objects.filter(
        AnyOf(F("job__project_id"), project_ids), ended_at__gte=since
    ).values_list(
        "job__project_id",
        "share_milli",
        EpochSeconds("started_at"),
        EpochSeconds("ended_at"),
        "gpu__sharing_mode",
        "gpu__oversubscription",
    ),
    row=EndedAllocationRow,
)


class PoolPolicyRow(NamedTuple):
    queue_policy: str
    scorer: str
    backfill: bool
    preemption: bool


POOL_POLICY = CompiledQuery(
    lambda: Pool.objects.order_by("pk").values_list(
        "queue_policy", "scorer", "backfill", "preemption"
    )[:1],
    row=PoolPolicyRow,
)


class PkRow(NamedTuple):
    pk: int


class KindRow(NamedTuple):
    kind: str


# Anything queued? One read answers the three questions: a job for our plan ("agents"), a job
# of a Slurm pool that Slurm has not got yet ("slurm": the hand-off), a job waiting on others
# ("dependencies": settled before planning). Slurm's jobs are never planned.
def _agents_queued() -> QuerySet[Job, tuple[str]]:
    return (
        Job.objects.filter(state=JobState.QUEUED, waiting_on_dependencies=False)
        .exclude(pool__backend=Pool.Backend.SLURM)
        .values_list(Value("agents", output_field=CharField()))[:1]
    )


def _dependencies_queued() -> QuerySet[Job, tuple[str]]:
    return Job.objects.filter(state=JobState.QUEUED, waiting_on_dependencies=True).values_list(
        Value("dependencies", output_field=CharField())
    )[:1]


def _slurm_queued() -> QuerySet[Job, tuple[str]]:
    return Job.objects.filter(
        state=JobState.QUEUED, pool__backend=Pool.Backend.SLURM, slurm__isnull=True
    ).values_list(Value("slurm", output_field=CharField()))[:1]


def _elastic_below_max() -> QuerySet[Job, tuple[str]]:
    """A running elastic job of our agents below its maximum: the cycle plans even with
    nothing queued, since it may grow into idle GPUs."""
    return (
        Job.objects.filter(state=JobState.RUNNING, elastic_max__gt=F("gpus"))
        .exclude(pool__backend=Pool.Backend.SLURM)
        .values_list(Value("elastic", output_field=CharField()))[:1]
    )


ANY_QUEUED = CompiledQuery(
    lambda: _agents_queued().union(
        _slurm_queued(), _dependencies_queued(), _elastic_below_max(), all=True
    ),
    row=KindRow,
)


def queued_kinds() -> set[str]:
    """{"agents", "slurm", "dependencies", "elastic"} or part of it: what the cycle has to do."""
    if connection.features.supports_slicing_ordering_in_compound:
        return {row[0] for row in ANY_QUEUED.rows()}
    # SQLite (the embedded default) takes no LIMIT inside a UNION: one read each
    parts = (_agents_queued(), _slurm_queued(), _dependencies_queued(), _elastic_below_max())
    return {kind for qs in parts for (kind,) in qs}


OVERDUE_PREEMPTION = CompiledQuery(
    lambda cutoff: Job.objects.filter(
        state=JobState.PREEMPTING, preempt_deadline__lt=cutoff
    ).values_list("pk")[:1],
    row=PkRow,
)


# `apply_plan`'s reads under its locks.
class LockedGpuRow(NamedTuple):
    pk: int
    node_id: int
    node_name: str
    node_state: str
    node_fenced: bool
    model_id: int
    health: str
    sharing_mode: str
    oversubscription: int
    memory_mib: int


LOCK_GPUS = CompiledQuery(
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
    ),
    row=LockedGpuRow,
)


class AllocationOnGpuRow(NamedTuple):
    """What holds a GPU now, or what ended on it after the cycle's `now` (ended_at set)."""

    gpu_id: int
    share_milli: int
    memory_mib: int
    ended_at: datetime | None


ALLOCATIONS_ON_GPUS = CompiledQuery(
    lambda gpu_ids, now: (
        Allocation.objects.filter(AnyOf(F("gpu_id"), gpu_ids))
        .filter(Q(ended_at__isnull=True) | Q(ended_at__gt=now))
        .values_list("gpu_id", "share_milli", "memory_mib", "ended_at")
    ),
    row=AllocationOnGpuRow,
)


class LockedQueuedJobRow(NamedTuple):
    pk: int
    attempt: int
    borrowed: bool
    state: str


def lock_queued_jobs(job_ids: list[int]) -> list[LockedQueuedJobRow]:
    """The placed jobs still queued, locked. A plain queryset: compiling it once measured
    1.04x at 10,000 x 1,000 and 1.27x at 25 nodes (`bench.fast_paths`), below the 1.5x a fast
    path must show (issue 26)."""
    rows = (
        Job.objects.select_for_update(of=("self",))
        .filter(AnyOf(F("pk"), job_ids), state=JobState.QUEUED)
        .order_by("pk")
        .values_list("pk", "attempt", "borrowed", "state")
    )
    return [LockedQueuedJobRow._make(row) for row in rows]
