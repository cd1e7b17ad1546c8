"""A quota edit reaches Slurm: the project's account limits are rewritten (after commit, by a
task, so that an unreachable cluster never holds up the admin)."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.db.models.signals import post_delete, post_save

from foundation.enqueue import enqueue
from scheduler.models import Quota, QuotaModelLimit, SlurmPool


def _quota_changed(sender: Any, instance: Any, **kwargs: Any) -> None:
    project_id = instance.project_id if sender is Quota else instance.quota.project_id
    if not SlurmPool.objects.exists():
        return
    # queued by name: services never import tasks
    transaction.on_commit(lambda: enqueue("scheduler.slurm_limits_project", project_id))


def connect() -> None:
    post_save.connect(_quota_changed, sender=Quota, dispatch_uid="slurm-quota-save")
    post_save.connect(_quota_changed, sender=QuotaModelLimit, dispatch_uid="slurm-limit-save")
    post_delete.connect(_quota_changed, sender=QuotaModelLimit, dispatch_uid="slurm-limit-del")
