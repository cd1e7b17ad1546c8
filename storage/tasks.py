"""Storage tasks: ids in, one service call, idempotent (state guards decide)."""

from __future__ import annotations

from celery import shared_task

from storage import datasets, services


@shared_task(name="storage.dataset_import", time_limit=3600, soft_time_limit=3500)  # type: ignore[untyped-decorator]
def dataset_import(volume_id: int) -> None:
    """Stream a dataset's source URL into its directory (a dataset no longer importing is
    left alone, so a redelivered task does nothing)."""
    datasets.dataset_import_run(volume_id=volume_id)


@shared_task(name="storage.volume_purge")  # type: ignore[untyped-decorator]
def volume_purge(volume_id: int) -> None:
    services.volume_purge(volume_id=volume_id)
