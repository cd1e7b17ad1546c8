"""Reads of the catalog and the fleet."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Q, QuerySet

from portal.errors import DomainError
from portal.models import Project
from scheduler.models import PRECISIONS, GpuModel, Node


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
            if not raw_mem.isdigit() or int(raw_mem) > 10_000:
                raise DomainError(
                    "min_memory_gb must be a whole number of GB between 0 and 10000.",
                    field="min_memory_gb",
                )
            min_memory_gb = int(raw_mem)
        precision = (params.get("precision") or "").strip().lower() or None
        if precision is not None and precision not in PRECISIONS:
            raise DomainError(
                f"precision must be one of: {', '.join(PRECISIONS)}.", field="precision"
            )
        return cls(min_memory_gb=min_memory_gb, precision=precision)


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
            # JSON containment is not portable to SQLite; the catalog is small, filter by name.
            names = [m.name for m in GpuModel.objects.all() if filters.precision in m.precisions]
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


def project_quota_usage(*, project: Project) -> list[QuotaRow]:
    """Quota limits beside current use. Use counts allocations once jobs exist."""
    quota = project.quota
    rows = [
        QuotaRow("Concurrent GPUs", 0, quota.max_gpus, "GPUs"),
        QuotaRow("GPU-hours this month", 0, quota.gpu_hours_per_month, "GPU-h"),
    ]
    rows += [
        QuotaRow(f"{limit.gpu_model.name} GPUs", 0, limit.max_gpus, "GPUs")
        for limit in quota.model_limits.select_related("gpu_model")
    ]
    return rows
