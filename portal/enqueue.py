"""Queue a Celery task by its registered name, so that services never import a `tasks.py`.

Tasks import services; services enqueue work by name (after commit): the task's own options and
the routes in settings apply as if it were called directly.
"""

from __future__ import annotations

from typing import Any

from celery import current_app


def enqueue(name: str, *args: Any) -> None:
    """Send the task registered as `name` to its queue."""
    current_app.tasks[name].apply_async(args)


def run_inline(name: str, *args: Any) -> Any:
    """Run the task registered as `name` in this thread (as `task.apply()`), for its result."""
    return current_app.tasks[name].apply(args).get()
