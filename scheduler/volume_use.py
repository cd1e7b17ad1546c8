"""The scheduler's answer to storage's "volume in use" port: which jobs that have not ended
mount a volume (a queued job counts: it would start without it)."""

from __future__ import annotations

from collections.abc import Collection, Mapping

from scheduler.models import TERMINAL_STATES, Job


def volumes_in_use(*, volume_ids: Collection[int]) -> Mapping[int, list[int]]:
    """Of these volumes, those that jobs not ended mount: volume id → the jobs' ids."""
    from storage.models import Volume

    out: dict[int, list[int]] = {}
    for volume in Volume.objects.filter(pk__in=list(volume_ids)).only("pk", "project_id", "name"):
        jobs = (
            Job.objects.filter(
                project_id=volume.project_id, volumes__contains=[{"name": volume.name}]
            )
            .exclude(state__in=TERMINAL_STATES)
            .values_list("pk", "volumes")
        )
        ids = [
            pk
            for pk, mounts in jobs
            if any(m.get("name") == volume.name and m.get("kind") != "scratch" for m in mounts)
        ]
        if ids:
            out[volume.pk] = ids
    return out
