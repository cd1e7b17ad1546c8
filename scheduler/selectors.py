"""Reads of the catalog and the fleet."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, Protocol

from django.core.cache import cache
from django.db.models import Count, OuterRef, Prefetch, Q, QuerySet, Subquery
from django.utils import timezone

from foundation.db import CompiledQuery, concrete_columns, instance_from_row
from foundation.params import whole_number
from portal.errors import DomainError, NotFound
from portal.models import Project, User
from portal.selectors import project_get_visible, project_list_visible_to
from scheduler.core.model import (
    MILLI,
    device_share_milli,
    gpu_capacity_milli,
    memory_gb_as_mib,
    model_may_take,
)
from scheduler.core.periods import month_start
from scheduler.models import PRECISIONS, Allocation, GpuModel, Job, JobState, LogChunk, Node


@dataclass(frozen=True)
class CatalogFilter:
    min_memory_gb: int | None = None
    precision: str | None = None

    @classmethod
    def parse(cls, params: dict[str, str]) -> CatalogFilter:
        """Parse query parameters; a bad value is a DomainError naming the parameter."""
        raw_mem = (params.get("min_memory_gb") or "").strip()
        min_memory_gb = None
        if raw_mem:
            min_memory_gb = whole_number(raw_mem, maximum=10_000)
            if min_memory_gb is None:
                raise DomainError(
                    "min_memory_gb must be a whole number of GB between 0 and 10000.",
                    field="min_memory_gb",
                )
        precision = (params.get("precision") or "").strip().lower() or None
        if precision is not None and precision not in PRECISIONS:
            raise DomainError(
                f"precision must be one of: {', '.join(PRECISIONS)}.", field="precision"
            )
        return cls(min_memory_gb=min_memory_gb, precision=precision)


# Fast path (`bench.submit_throughput`, docs/benchmarks.md "Jobs from API submit to running"):
# every submission that names a model asks; the row maps to the model in `instance_from_row`.
_ACTIVE_MODEL_NAMED = CompiledQuery(
    lambda name: GpuModel.objects.filter(is_active=True, name=name).values_list(
        *concrete_columns(GpuModel)
    )
)


def gpu_model_active(name: str) -> GpuModel | None:
    """The catalog's active GPU model of that name, or None."""
    rows = _ACTIVE_MODEL_NAMED.rows(name=name)
    if not rows:
        return None
    return instance_from_row(GpuModel, rows[0])


class ModelAsk(Protocol):
    """What a job request says of the GPU models it may land on (a `JobSpec` or a `Job`)."""

    @property
    def gpu_model(self) -> GpuModel | None: ...
    @property
    def gpu_models(self) -> Sequence[str]: ...
    @property
    def min_gpu_memory_gb(self) -> int: ...
    @property
    def precisions(self) -> Sequence[str]: ...


def _may_take(
    models: Iterable[GpuModel],
    *,
    named: Collection[str],
    min_memory_gb: int,
    precisions: Iterable[str],
) -> list[GpuModel]:
    wanted, floor = tuple(precisions), memory_gb_as_mib(min_memory_gb)
    return [
        m
        for m in models
        if model_may_take(
            named=named,
            min_memory_mib=floor,
            precisions=wanted,
            model=m.name,
            memory_mib=m.memory_mib,
            model_precisions=m.precisions,
        )
    ]


def gpu_models_job_may_use(ask: ModelAsk) -> list[GpuModel]:
    """The catalog models a job may land on (`model_may_take`, the planner's own rule): its
    model if that meets its memory and precisions, else the active models it names (any when
    none) that do. The quotes, admission and billing's hard-cap check ask this."""
    if ask.gpu_model is not None:
        models: Iterable[GpuModel] = [ask.gpu_model]
    else:
        models = GpuModel.objects.filter(is_active=True)
    return _may_take(
        models,
        named=tuple(ask.gpu_models) if ask.gpu_model is None else (),
        min_memory_gb=ask.min_gpu_memory_gb,
        precisions=ask.precisions,
    )


def gpu_models_meeting(*, min_memory_gb: int = 0, precisions: Iterable[str] = ()) -> list[GpuModel]:
    """Active catalog models with at least this much memory and every one of these precisions
    (`model_may_take`; precisions are checked in Python: JSON containment is not portable to
    SQLite, and the catalog is a handful of rows)."""
    return _may_take(
        GpuModel.objects.filter(is_active=True),
        named=(),
        min_memory_gb=min_memory_gb,
        precisions=precisions,
    )


def gpu_model_list(*, filters: CatalogFilter | None = None) -> QuerySet[GpuModel]:
    """Active catalog entries with how many healthy GPUs of each the fleet has."""
    qs = GpuModel.objects.filter(is_active=True).annotate(
        fleet_gpus=Count(
            "gpus",
            filter=Q(gpus__node__state=Node.State.READY, gpus__health="healthy"),
        )
    )
    if filters is not None:
        if filters.min_memory_gb is not None:
            qs = qs.filter(memory_gb__gte=filters.min_memory_gb)
        if filters.precision is not None:
            names = [m.name for m in gpu_models_meeting(precisions=[filters.precision])]
            qs = qs.filter(name__in=names)
    return qs.order_by("-memory_gb", "name")


@dataclass(frozen=True)
class QuotaRow:
    label: str
    used: float
    limit: float | None
    unit: str

    @property
    def percent(self) -> int:
        if not self.limit:
            return 0
        return min(100, round(100 * self.used / self.limit))


def project_gpu_hours(project: Project, *, since: datetime, now: datetime) -> Decimal:
    """GPU-hours the project used since `since`: a share counts as the part of its device it
    holds (`device_share_milli`, its compute part; billing bills `billed_share_milli`)."""
    total = Decimal(0)
    rows = Allocation.objects.filter(job__project=project).exclude(ended_at__lt=since)
    for share, sharing, factor, started, ended in rows.values_list(
        "share_milli", "gpu__sharing_mode", "gpu__oversubscription", "started_at", "ended_at"
    ):
        seconds = ((ended or now) - max(started, since)).total_seconds()
        held = device_share_milli(share, gpu_capacity_milli(sharing, factor))
        total += Decimal(max(0.0, seconds)) * held / MILLI / 3600
    return total.quantize(Decimal("0.01"))


def active_gpu_usage(project: Project) -> dict[str, float]:
    """GPUs a project holds now, per model name and in total under "*" (fractions count)."""
    usage: dict[str, float] = defaultdict(float)
    for model, share in Allocation.objects.filter(
        job__project=project, ended_at__isnull=True
    ).values_list("gpu_model__name", "share_milli"):
        usage[model] += share / 1000
        usage["*"] += share / 1000
    return usage


def project_quota_usage(*, project: Project) -> list[QuotaRow]:
    """Quota limits beside current use: GPUs held now and GPU-hours this calendar month."""
    quota = project.quota
    now = timezone.now()
    held = active_gpu_usage(project)
    hours = project_gpu_hours(project, since=month_start(now), now=now)
    rows = [
        QuotaRow("Concurrent GPUs", held["*"], quota.max_gpus, "GPUs"),
        QuotaRow("GPU-hours this month", float(hours), quota.gpu_hours_per_month, "GPU-h"),
    ]
    rows += [
        QuotaRow(f"{limit.gpu_model.name} GPUs", held[limit.gpu_model.name], limit.max_gpus, "GPUs")
        for limit in quota.model_limits.select_related("gpu_model")
    ]
    return rows


def job_list_visible_to(*, user: User) -> QuerySet[Job]:
    """Jobs of the projects the user may see, with what list views show, in one query."""
    projects = project_list_visible_to(user=user)
    return (
        Job.objects.filter(project__in=projects)
        .select_related("project", "gpu_model", "submitted_by")
        .order_by("-created_at", "-pk")
    )


def with_landed_model(qs: QuerySet[Job]) -> QuerySet[Job]:
    """Each job with `landed_on`: the model of the GPUs it holds now (None when it holds
    none), so that a list can say where a job that named no model runs."""
    held = Allocation.objects.filter(job=OuterRef("pk"), ended_at__isnull=True)
    return qs.annotate(landed_on=Subquery(held.values("gpu_model__name")[:1]))


def job_get_visible(*, user: User, job_id: int) -> Job:
    job = job_list_visible_to(user=user).filter(pk=job_id).first()
    if job is None:
        raise NotFound("No such job.")
    return job


def job_filter(qs: QuerySet[Job], params: dict[str, str]) -> QuerySet[Job]:
    """Apply list filters; a bad value is a DomainError naming the parameter."""
    state = params.get("state", "").strip()
    if state:
        states = [s for s in state.split(",") if s]
        unknown = sorted(set(states) - set(JobState.values))
        if unknown:
            raise DomainError(
                f"Unknown state {', '.join(unknown)}; use {', '.join(JobState.values)}.",
                field="state",
            )
        qs = qs.filter(state__in=states)
    for name in ("project", "gpu_model"):
        if "\x00" in params.get(name, ""):  # PostgreSQL cannot compare with a NUL character
            raise DomainError(f"{name} may not contain NUL characters.", field=name)
    if params.get("project"):
        qs = qs.filter(project__slug=params["project"])
    if params.get("gpu_model"):
        qs = qs.filter(gpu_model__name=params["gpu_model"])
    return qs


def job_placement(job: Job) -> list[dict[str, object]]:
    """Where the job's current attempt runs: node, GPU index, UUID, model, share."""
    return [
        {
            "node": a.node.name,
            "gpu_index": a.gpu.index,
            "gpu_uuid": a.gpu.uuid,
            "gpu_model": a.gpu_model.name,
            "share_milli": a.share_milli,
            "capacity_milli": a.gpu.capacity_milli,
            "since": a.started_at,
        }
        for a in job.allocations.filter(ended_at__isnull=True).select_related(
            "node", "gpu", "gpu_model"
        )
    ]


def job_members(job: Job) -> list[dict[str, object]]:
    """A gang's members in its latest attempt: rank, node, GPUs and what became of each."""
    return [
        {
            "rank": m.rank,
            "first_rank": m.first_rank,
            "node": m.node.name,
            "gpus": m.gpus,
            "state": m.state,
            "exit_code": m.exit_code,
            "message": m.message,
            "started_at": m.started_at,
            "ended_at": m.ended_at,
        }
        for m in job.members.filter(attempt=job.attempt).select_related("node").order_by("rank")
    ]


def job_log_text(job: Job, *, after_id: int = 0, limit: int = 500) -> tuple[str, int]:
    """Log text after chunk id `after_id` (for live tails) and the last id returned.
    A Slurm pool's job: its output file from byte `after_id` (the id is the file offset)."""
    from scheduler import backends

    if backends.is_external(job):
        from scheduler.backends.slurm.logs import log_text

        return log_text(job, after=after_id)
    chunks = list(
        LogChunk.objects.filter(job=job, pk__gt=after_id)
        .order_by("pk")
        .values_list("pk", "text")[:limit]
    )
    if not chunks:
        return "", after_id
    return "".join(text for _, text in chunks), chunks[-1][0]


def telemetry_key(gpu_id: int) -> str:
    """Where the latest telemetry sample of a GPU is cached (written on every heartbeat)."""
    return f"telemetry:gpu:{gpu_id}"


def latest_telemetry(gpu_ids: list[int]) -> dict[int, dict[str, Any]]:
    """The latest sample per GPU (absent when its node has been silent for two minutes)."""
    found = cache.get_many([telemetry_key(i) for i in gpu_ids])
    return {int(k.rsplit(":", 1)[1]): v for k, v in found.items()}


def project_with_quota(*, user: User, slug: str) -> Project:
    """A project the user may see, with its quota and per-model limits loaded."""
    project = project_get_visible(user=user, slug=slug)
    return (
        Project.objects.select_related("quota")
        .prefetch_related(Prefetch("quota__model_limits"))
        .get(pk=project.pk)
    )
