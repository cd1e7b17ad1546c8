"""Asking for a scheduling cycle: requests coalesce; the cycle task is queued by name.

Services call `request_cycle` after commit; `scheduler.tasks.scheduling_cycle` runs the cycle.
"""

from __future__ import annotations

from django.conf import settings
from django.core.cache import cache

from portal.enqueue import enqueue, run_inline

CYCLE_TASK = "scheduler.cycle"
CYCLE_REQUESTED = "scheduler:cycle-requested"
CYCLE_RETRY_SECONDS = 0.25  # a cycle that found another running tries again this much later


def request_cycle() -> None:
    """Ask for a cycle soon (job submitted or ended). Call after commit.

    Requests coalesce: while one cycle is already queued, more requests add nothing, since
    that cycle sees every job queued before it starts.
    """
    if getattr(settings, "SCHEDULER_SYNC_CYCLE", False):
        run_inline(CYCLE_TASK)
        return
    if cache.add(CYCLE_REQUESTED, 1, timeout=5):
        enqueue(CYCLE_TASK)
