"""Celery tasks of the Slurm backend (scheduled in CELERY_BEAT_SCHEDULE)."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="scheduler.slurm_sync", ignore_result=True)
def slurm_sync() -> dict[str, int]:
    """Slurm's job states and nodes → ours (every few seconds)."""
    from scheduler.backends.slurm.sync import sync_all

    return sync_all()


@shared_task(name="scheduler.slurm_limits", ignore_result=True)
def slurm_limits() -> int:
    """Quotas → Slurm association limits (sacctmgr)."""
    from scheduler.backends.slurm.accounts import sync_all_limits

    return sync_all_limits()


@shared_task(name="scheduler.slurm_limits_project", ignore_result=True)
def slurm_limits_project(project_id: int) -> int:
    """One project's quota → its Slurm account's limits in every Slurm pool it has an account
    in (after a quota edit)."""
    from scheduler.backends.slurm.accounts import sync_project_limits

    return sync_project_limits(project_id)
