"""The benchmark stack's Celery app: the project's own, plus each task's CPU time.

    celery -A bench.worker_meter worker ...   (bench.stack does this when TASK_METER_FILE is set)

Around every task the worker runs, the thread's CPU time (the stack's worker uses the threads
pool, so thread time is the task's own) is added to its name's total; a scheduling cycle is
counted apart as `scheduler.cycle (planned)` when it read the snapshot (it placed or left
something pending) and `scheduler.cycle (nothing queued)` otherwise. The totals are written as
JSON to TASK_METER_FILE at most every second, so a reader can difference two readings.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

from celery.signals import task_postrun, task_prerun

from config.celery import app

__all__ = ["app"]

_PATH = os.environ.get("TASK_METER_FILE", "")
_lock = threading.Lock()
_started: dict[str, float] = {}  # task id -> thread CPU time at its start
_totals: dict[str, list[float]] = {}  # name -> [count, CPU seconds]
_written = [0.0]


@task_prerun.connect
def _begin(task_id: str = "", **_kw: Any) -> None:
    _started[task_id] = time.thread_time()


@task_postrun.connect
def _end(task_id: str = "", task: Any = None, retval: Any = None, **_kw: Any) -> None:
    begun = _started.pop(task_id, None)
    if begun is None or task is None:
        return
    used = time.thread_time() - begun
    name = str(task.name)
    if name == "scheduler.cycle":
        if retval is None:
            name += " (another was running)"
        elif isinstance(retval, dict) and (retval.get("placed") or retval.get("pending")):
            name += " (planned)"
        else:
            name += " (nothing queued)"
    with _lock:
        entry = _totals.setdefault(name, [0.0, 0.0])
        entry[0] += 1
        entry[1] += used
        now = time.monotonic()
        if _PATH and now - _written[0] >= 1.0:
            _written[0] = now
            tmp = _PATH + ".tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(_totals, f)
            os.replace(tmp, _PATH)
