"""Writes for volumes and the storage quota. Members (and owners) create and delete volumes,
operators set quotas; every write is audited. Datasets' uploads and imports: `datasets.py`;
asking for more quota: `quota_requests.py`."""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from foundation.enqueue import enqueue
from portal.audit import audit_record
from portal.errors import Conflict, DomainError, NotFound, PermissionDenied
from portal.models import Project, Role, User
from portal.services import require_role
from storage.models import (
    LIVE_STATES,
    MAX_VOLUME_GIB,
    FillState,
    StorageQuota,
    Volume,
    VolumeKind,
    VolumeState,
    volume_name_validator,
)
from storage.ports import VOLUME_IN_USE
from storage.selectors import storage_allocated_gib

WRITERS = (Role.OWNER, Role.MEMBER)
MAX_QUOTA_GIB = 100_000_000


def _quota_locked(project: Project) -> StorageQuota:
    """The project's quota row, made with the default if missing, locked: volume creations and
    quota changes of one project take turns, so two creations cannot both fit the last GiB."""
    StorageQuota.objects.get_or_create(
        project=project, defaults={"max_gib": settings.STORAGE_DEFAULT_QUOTA_GIB}
    )
    return StorageQuota.objects.select_for_update().get(project=project)


def quota_check(*, project: Project, quota: StorageQuota, adding_gib: int, field: str) -> None:
    """Refuse `adding_gib` more when the project's live volumes would pass its quota: the
    message names the numbers and how to get more."""
    allocated = storage_allocated_gib(project=project)
    if allocated + adding_gib > quota.max_gib:
        left = max(0, quota.max_gib - allocated)
        raise DomainError(
            f"{project.slug}'s storage quota is {quota.max_gib} GiB and its volumes take "
            f"{allocated} GiB: {adding_gib} GiB more does not fit ({left} GiB left). Delete a "
            "volume or ask for more quota on the project's Storage page.",
            code="storage_quota_exceeded",
            field=field,
        )


def _validate_new(*, name: str, kind: str, size_gib: int, is_dataset: bool, node_name: str) -> None:
    try:
        volume_name_validator(name)
    except ValidationError as exc:
        raise DomainError(" ".join(exc.messages), field="name") from None
    if kind not in VolumeKind.values:
        kinds = ", ".join(VolumeKind.values)
        raise DomainError(f"A volume's kind is one of {kinds}.", field="kind")
    if not 1 <= size_gib <= MAX_VOLUME_GIB:
        raise DomainError(f"A volume's size is 1 to {MAX_VOLUME_GIB} GiB.", field="size_gib")
    if is_dataset and kind != VolumeKind.SHARED:
        raise DomainError("A dataset is a shared volume (kind shared).", field="kind")
    if node_name and kind != VolumeKind.NODE_LOCAL:
        raise DomainError("Only a node-local volume names a node.", field="node_name")
    if len(node_name) > 253 or any(c.isspace() for c in node_name):
        raise DomainError("A node's name is up to 253 characters, no spaces.", field="node_name")


@transaction.atomic
def volume_create(
    *,
    actor: User,
    project: Project,
    name: str,
    kind: str,
    size_gib: int,
    is_dataset: bool = False,
    node_name: str = "",
    source_url: str = "",
) -> Volume:
    """A new volume within the project's storage quota. A dataset with a `source_url` is
    imported from it (a Celery task, after the commit); one without waits for an upload."""
    require_role(user=actor, project=project, roles=WRITERS)
    name, node_name, source_url = name.strip(), node_name.strip(), source_url.strip()
    _validate_new(
        name=name, kind=kind, size_gib=size_gib, is_dataset=is_dataset, node_name=node_name
    )
    if source_url:
        if not is_dataset:
            raise DomainError("Only a dataset is imported from a URL.", field="source_url")
        from storage.datasets import import_url_check

        import_url_check(source_url)
    quota = _quota_locked(project)
    if Volume.objects.filter(project=project, name=name, state=VolumeState.ACTIVE).exists():
        raise Conflict(f"{project.slug} already has a volume named {name!r}.", code="name_taken")
    quota_check(project=project, quota=quota, adding_gib=size_gib, field="size_gib")
    try:
        with transaction.atomic():
            volume = Volume.objects.create(
                project=project,
                name=name,
                kind=kind,
                size_gib=size_gib,
                is_dataset=is_dataset,
                node_name=node_name,
                source_url=source_url,
                fill_state=FillState.IMPORTING if source_url else FillState.EMPTY,
                created_by=actor,
            )
    except IntegrityError:  # the same name, created meanwhile
        raise Conflict(
            f"{project.slug} already has a volume named {name!r}.", code="name_taken"
        ) from None
    audit_record(
        actor=actor,
        action="storage.volume.create",
        target=volume,
        project=project,
        data={
            "name": name,
            "kind": kind,
            "size_gib": size_gib,
            "dataset": is_dataset,
            "node": node_name,
            "source_url": source_url,
        },
    )
    if source_url:
        transaction.on_commit(lambda: enqueue("storage.dataset_import", volume.pk))
    return volume


def _in_use_message(volume: Volume, job_ids: list[int]) -> str:
    shown = ", ".join(str(j) for j in sorted(job_ids)[:5])
    more = f" and {len(job_ids) - 5} more" if len(job_ids) > 5 else ""
    jobs = "job" if len(job_ids) == 1 else "jobs"
    return (
        f"Volume {volume.name} is mounted by active {jobs} {shown}{more}; it can be deleted "
        "once they end (cancel them or wait)."
    )


@transaction.atomic
def volume_delete(*, actor: User, project: Project, volume_id: int) -> Volume:
    """Delete a volume no active job mounts (409 otherwise). Metering stops now; a shared
    volume's files are removed by a task after the commit, node-local ones by their agent."""
    require_role(user=actor, project=project, roles=WRITERS)
    volume = (
        Volume.objects.select_for_update()
        .filter(project=project, pk=volume_id, state__in=LIVE_STATES)
        .first()
    )
    if volume is None:
        raise NotFound("No such volume.")
    if volume.state == VolumeState.DELETING:
        raise Conflict(f"Volume {volume.name} is already being deleted.")
    in_use = VOLUME_IN_USE.get()(volume_ids=[volume.pk]).get(volume.pk)
    if in_use:
        raise Conflict(_in_use_message(volume, list(in_use)), code="volume_in_use")
    volume.deleted_at = timezone.now()
    volume.state = VolumeState.DELETING if volume.kind == VolumeKind.SHARED else VolumeState.DELETED
    volume.save(update_fields=["state", "deleted_at"])
    audit_record(
        actor=actor,
        action="storage.volume.delete",
        target=volume,
        project=project,
        data={"name": volume.name, "kind": volume.kind, "size_gib": volume.size_gib},
    )
    if volume.state == VolumeState.DELETING:
        volume_id = volume.pk
        transaction.on_commit(lambda: enqueue("storage.volume_purge", volume_id))
    return volume


@transaction.atomic
def volume_purge(*, volume_id: int) -> None:
    """Remove a deleted shared volume's files and mark it deleted (idempotent)."""
    from storage.paths import volume_files_remove

    volume = Volume.objects.select_for_update().filter(pk=volume_id).first()
    if volume is None or volume.state != VolumeState.DELETING:
        return
    volume_files_remove(volume.pk)
    volume.state = VolumeState.DELETED
    volume.save(update_fields=["state"])
    audit_record(
        actor=None,
        action="storage.volume.purged",
        target=volume,
        project=volume.project,
        data={"name": volume.name},
    )


@transaction.atomic
def volume_bind_node(*, volume_id: int, node_name: str) -> Volume:
    """The scheduler's call when it first places a job that mounts a node-local volume with no
    node yet: the volume now lives on `node_name` (a volume already bound keeps its node)."""
    volume = Volume.objects.select_for_update().select_related("project").get(pk=volume_id)
    if volume.kind != VolumeKind.NODE_LOCAL:
        raise DomainError(f"Volume {volume.name} is not node-local.", field="node_name")
    if volume.node_name:
        return volume
    volume.node_name = node_name
    volume.save(update_fields=["node_name"])
    audit_record(
        actor=None,
        action="storage.volume.bind_node",
        target=volume,
        project=volume.project,
        data={"name": volume.name, "node": node_name},
    )
    return volume


@transaction.atomic
def storage_quota_set(*, actor: User, project: Project, max_gib: int) -> StorageQuota:
    """Operators set a project's storage quota. Lowering it below what its volumes take is
    allowed (no volume is removed): new volumes are then refused until it fits again."""
    if not actor.is_staff:
        raise PermissionDenied("Only operators set storage quotas.")
    if not 0 <= max_gib <= MAX_QUOTA_GIB:
        raise DomainError(f"A storage quota is 0 to {MAX_QUOTA_GIB} GiB.", field="max_gib")
    quota = _quota_locked(project)
    before = quota.max_gib
    quota.max_gib = max_gib
    quota.updated_by = actor
    quota.save(update_fields=["max_gib", "updated_by", "updated_at"])
    audit_record(
        actor=actor,
        action="storage.quota.set",
        target=quota,
        project=project,
        data={"max_gib": {"from": before, "to": max_gib}},
    )
    return quota
