"""Every project has a quota row: created with the project, in its transaction.

Projects belong to tenancy, which knows nothing of quotas; the scheduler, which admits against
them, listens for new projects (connected in `SchedulerConfig.ready`).
"""

from __future__ import annotations

from typing import Any

from portal.models import Project
from scheduler.models import Quota


def create_quota_for_new_project(
    sender: type[Project], instance: Project, created: bool, raw: bool = False, **_: Any
) -> None:
    """The default quota (see `Quota`'s fields) for a project just created; fixtures bring
    their own rows."""
    if created and not raw:
        Quota.objects.get_or_create(project=instance)
