"""Queue a Celery task by its registered name, so that services never import a `tasks.py`.

Tasks import services; services enqueue work by name (after commit): the task's own options and
the routes in settings apply as if it were called directly.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import current_app

# One thread imports the tasks; the others wait for it. Without this, threads of a web worker
# that miss a name at the same moment see the registry while the first is still importing, and
# answer `NotRegistered` (a 500 under load).
_importing = threading.Lock()


def tasks_import() -> None:
    """Import every installed app's `tasks.py` and the configured task modules, as a worker
    does at start, so that every task is registered with its own options.

    Not through `loader.import_default_modules()`: its signal also runs Celery's Django fixup,
    which validates the models by running all of Django's system checks (about 90 ms of CPU
    in a web worker, paid by the first request that queued a task). The web and agent entry
    points call this once as the worker boots (`config/wsgi.py`)."""
    current_app.autodiscover_tasks(force=True)
    for module in current_app.loader.default_modules:
        current_app.loader.import_task_module(module)


def task_named(name: str) -> Any:
    """The task registered as `name`. A process that imported no `tasks.py` (a web worker
    before its entry point did) imports them all the first time a name is missing, so the
    task's own options and routes apply."""
    if name not in current_app.tasks:
        with _importing:
            if name not in current_app.tasks:
                tasks_import()
    return current_app.tasks[name]


def enqueue(name: str, *args: Any) -> None:
    """Send the task registered as `name` to its queue."""
    task_named(name).apply_async(args)


def run_inline(name: str, *args: Any) -> Any:
    """Run the task registered as `name` in this thread (as `task.apply()`), for its result."""
    return task_named(name).apply(args).get()
