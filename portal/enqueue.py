"""Queue a Celery task by its registered name, so that services never import a `tasks.py`.

Tasks import services; services enqueue work by name (after commit): the task's own options and
the routes in settings apply as if it were called directly.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import current_app

_IMPORTING = threading.Lock()


def task_named(name: str) -> Any:
    """The task registered as `name`. A web process imports no `tasks.py` by itself: the first
    time a name is missing, every installed app's tasks are imported (Celery's autodiscovery,
    as a worker does at start), so the task's own options and routes apply."""
    if name not in current_app.tasks:
        # one thread imports them: two at once can each see the other's half-imported module
        # (the first submits of a threaded server; `bench.slurm_latency` met it)
        with _IMPORTING:
            if name not in current_app.tasks:
                current_app.loader.import_default_modules()
    return current_app.tasks[name]


def enqueue(name: str, *args: Any) -> None:
    """Send the task registered as `name` to its queue."""
    task_named(name).apply_async(args)


def run_inline(name: str, *args: Any) -> Any:
    """Run the task registered as `name` in this thread (as `task.apply()`), for its result."""
    return task_named(name).apply(args).get()
