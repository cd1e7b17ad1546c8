"""Celery tasks of the scheduler: ids in, one service call, idempotent."""

from __future__ import annotations

import logging
import time

from celery import shared_task
from django.core.cache import cache

from portal.locks import single_flight
from scheduler import estimates, ports
from scheduler.backends.slurm.tasks import (  # noqa: F401  (registers them)
    slurm_limits,
    slurm_limits_project,
    slurm_sync,
)
from scheduler.cycle import run_cycle
from scheduler.cycle_requests import CYCLE_REQUESTED, CYCLE_RETRY_SECONDS
from scheduler.notices import job_notices_send

log = logging.getLogger(__name__)


@shared_task(name="scheduler.cycle", ignore_result=True, time_limit=60, soft_time_limit=50)
def scheduling_cycle() -> dict[str, int] | None:
    """One scheduling cycle, single-flight: a cycle already running makes this one a retry
    after it, so that no request is left waiting for beat."""
    cache.delete(CYCLE_REQUESTED)  # requests from now on need a cycle after this one
    # The lock outlives the hard time limit, so a killed cycle frees it within a minute.
    with single_flight("scheduler-cycle", ttl=65) as acquired:
        if not acquired:
            # The cycle running now may have read the queue before the job that asked for this
            # one was committed: run once more after it, coalesced like any request. (An eager
            # call, run inline by its caller, is not repeated.)
            if not scheduling_cycle.request.is_eager and cache.add(CYCLE_REQUESTED, 1, timeout=5):
                scheduling_cycle.apply_async(countdown=CYCLE_RETRY_SECONDS)
            return None
        result = run_cycle()
    ended_at = time.time()
    for listener in ports.CYCLE_LISTENERS:
        listener(seconds=result.seconds, at=ended_at, placed=len(result.placed))
    if result.placed or result.preempted:
        log.info(
            "cycle: placed %d, preempted %d, pending %d in %.3fs",
            len(result.placed),
            len(result.preempted),
            result.pending,
            result.seconds,
        )
    return {
        "placed": len(result.placed),
        "preempted": len(result.preempted),
        "pending": result.pending,
    }


@shared_task(name="scheduler.health_sweep", ignore_result=True, time_limit=60, soft_time_limit=50)
def health_sweep() -> int:
    """Mark silent nodes lost and requeue their work. Idempotent."""
    from scheduler.nodes import lost_nodes_sweep

    return len(lost_nodes_sweep())


@shared_task(name="provisioning.autoscale", ignore_result=True, time_limit=120, soft_time_limit=100)
def autoscale() -> int:
    """One pass of every autoscaler, single-flight."""
    from scheduler.provisioning import autoscale as run

    with single_flight("autoscaler", ttl=110) as acquired:
        if not acquired:
            return 0
        return len(run())


@shared_task(name="scheduler.job_notices", ignore_result=True, time_limit=60, soft_time_limit=50)
def job_notices(events: list[list[object]]) -> int:
    """E-mail and webhook notices of job moves (scheduler/notices.py)."""
    return job_notices_send(events=events)


@shared_task(
    name="scheduler.model_availability_refresh",
    ignore_result=True,
    time_limit=60,
    soft_time_limit=50,
)
def model_availability_refresh() -> None:
    """The submit form's and dashboard's availability table, computed off the request path."""
    estimates.model_availability_refresh()
