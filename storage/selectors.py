"""Reads scoped to what a user may see: a project's volumes and its storage quota."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Count, QuerySet, Sum

from portal.errors import NotFound
from portal.models import Project, User
from portal.selectors import project_get_visible
from storage.models import LIVE_STATES, StorageQuota, StorageQuotaRequest, Volume, VolumeState


def volume_list(*, project: Project) -> QuerySet[Volume]:
    """The project's live volumes (the caller has already read the project through
    `project_get_visible`, which is the scoping)."""
    return Volume.objects.filter(project=project, state__in=LIVE_STATES).order_by("name")


def volume_list_visible(*, user: User, project_slug: str) -> tuple[Project, QuerySet[Volume]]:
    project = project_get_visible(user=user, slug=project_slug)
    return project, volume_list(project=project)


def volume_get(*, project: Project, name: str) -> Volume:
    volume = volume_list(project=project).filter(name=name).first()
    if volume is None:
        raise NotFound(f"{project.slug} has no volume named {name!r}.")
    volume.project = project
    return volume


def volume_get_visible(*, user: User, project_slug: str, name: str) -> Volume:
    return volume_get(project=project_get_visible(user=user, slug=project_slug), name=name)


def volume_get_by_id_visible(*, user: User, project_slug: str, volume_id: int) -> Volume:
    project = project_get_visible(user=user, slug=project_slug)
    volume = volume_list(project=project).filter(pk=volume_id).first()
    if volume is None:
        raise NotFound("No such volume.")
    volume.project = project
    return volume


def storage_quota_gib(*, project: Project) -> int:
    """The project's storage quota in GiB (the default until operators set one)."""
    row = StorageQuota.objects.filter(project=project).values_list("max_gib", flat=True).first()
    return int(settings.STORAGE_DEFAULT_QUOTA_GIB) if row is None else int(row)


def storage_allocated_gib(*, project: Project) -> int:
    """What the project's active volumes' size limits add up to: what the quota counts (a
    volume being deleted no longer does)."""
    total = Volume.objects.filter(project=project, state=VolumeState.ACTIVE).aggregate(
        total=Sum("size_gib")
    )["total"]
    return int(total or 0)


@dataclass(frozen=True)
class StorageUsage:
    quota_gib: int
    allocated_gib: int
    used_bytes: int
    volumes: int

    @property
    def free_gib(self) -> int:
        return max(0, self.quota_gib - self.allocated_gib)

    @property
    def percent(self) -> int:
        if self.quota_gib <= 0:
            return 100 if self.allocated_gib else 0
        return min(100, self.allocated_gib * 100 // self.quota_gib)


def storage_usage(*, project: Project) -> StorageUsage:
    totals = Volume.objects.filter(project=project, state=VolumeState.ACTIVE).aggregate(
        gib=Sum("size_gib"), used=Sum("used_bytes"), n=Count("id")
    )
    return StorageUsage(
        quota_gib=storage_quota_gib(project=project),
        allocated_gib=int(totals["gib"] or 0),
        used_bytes=int(totals["used"] or 0),
        volumes=int(totals["n"] or 0),
    )


def storage_requests_of(*, project: Project) -> QuerySet[StorageQuotaRequest]:
    return (
        StorageQuotaRequest.objects.filter(project=project)
        .select_related("requested_by", "decided_by")
        .order_by("-created_at")
    )


def storage_requests_pending() -> QuerySet[StorageQuotaRequest]:
    """Operators: storage quota requests waiting for a decision, oldest first."""
    return (
        StorageQuotaRequest.objects.filter(status="pending")
        .select_related("project", "requested_by")
        .order_by("created_at")
    )


def storage_overview() -> list[tuple[Project, StorageUsage]]:
    """Operators: every project with its storage quota and what its volumes take."""
    quotas = dict(StorageQuota.objects.values_list("project_id", "max_gib"))
    totals: dict[int, dict[str, Any]] = {
        row["project_id"]: dict(row)
        for row in Volume.objects.filter(state=VolumeState.ACTIVE)
        .values("project_id")
        .annotate(gib=Sum("size_gib"), used=Sum("used_bytes"), n=Count("id"))
        .order_by()
    }
    out = []
    for project in Project.objects.order_by("name"):
        row = totals.get(project.pk, {})
        out.append(
            (
                project,
                StorageUsage(
                    quota_gib=int(quotas.get(project.pk, settings.STORAGE_DEFAULT_QUOTA_GIB)),
                    allocated_gib=int(row.get("gib") or 0),
                    used_bytes=int(row.get("used") or 0),
                    volumes=int(row.get("n") or 0),
                ),
            )
        )
    return out
