"""The Celery application shared by every worker and beat."""

import os
from typing import Any

from celery import Celery
from celery.signals import task_postrun, task_prerun
from django.db import close_old_connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")

app = Celery("config")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@task_prerun.connect
@task_postrun.connect
def close_connections_past_their_age(task: Any = None, **_kwargs: Any) -> None:
    """Around each task, what Django does around each request: a connection older than
    CONN_MAX_AGE, or one left unusable, is closed; the others serve the next task. Not for an
    eager task (`apply()`): it runs in its caller's thread, on the caller's connection."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    close_old_connections()
