"""Celery tasks of the scheduler: ids in, one service call, idempotent."""

from __future__ import annotations

import logging
import time

from celery import shared_task

from foundation.locks import single_flight
from scheduler import cycle_requests, estimates, ports
from scheduler.backends.slurm.tasks import (  # noqa: F401  (registers them)
    slurm_limits,
    slurm_limits_project,
    slurm_sync,
)
from scheduler.cycle import run_cycle
from scheduler.job_notices import job_notices_drain, job_notices_send

log = logging.getLogger(__name__)


@shared_task(name="scheduler.cycle", ignore_result=True, time_limit=60, soft_time_limit=50)
def scheduling_cycle() -> dict[str, int] | None:
    """Scheduling cycles, single-flight: another pass while requests keep coming (a burst of
    submits costs one task message), then requests go back to sending tasks.

    A task that finds a cycle running leaves its request to that cycle (`cycle_requests`)."""
    eager = scheduling_cycle.request.is_eager
    ran = False
    try:
        # The lock outlives the hard time limit, so a killed cycle frees it within a minute.
        with single_flight("scheduler-cycle", ttl=65) as acquired:
            if not acquired:
                # The cycle running now may have read the queue before the job that asked for
                # this one was committed: it plans once more, unless it has just finished; then
                # run after it. (An eager call, run inline by its caller, is not repeated.)
                if not eager and cycle_requests.request_deferred():
                    scheduling_cycle.apply_async(countdown=cycle_requests.CYCLE_RETRY_SECONDS)
                return None
            ran = True
            return _passes(once=eager)
    finally:
        # The lock is released; a pass that failed hands its requests back as well.
        if ran and cycle_requests.requests_release():
            scheduling_cycle.apply_async()  # a request came as this one finished


def _passes(*, once: bool) -> dict[str, int]:
    """Cycles while requests came during the last one (at most `CYCLE_LOOP_SECONDS`)."""
    placed = preempted = 0
    started = time.monotonic()
    while True:
        began = time.monotonic()
        cycle_requests.pass_begin()
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
        placed += len(result.placed)
        preempted += len(result.preempted)
        if once or not cycle_requests.requested_since_pass():
            break
        if time.monotonic() - started > cycle_requests.CYCLE_LOOP_SECONDS:
            break  # `requests_release` sends a fresh task for what came since
        time.sleep(max(0.0, began + cycle_requests.CYCLE_BATCH_SECONDS - time.monotonic()))
    return {"placed": placed, "preempted": preempted, "pending": result.pending}


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
def job_notices(events: list[list[object]] | None = None) -> int:
    """E-mail and webhook notices of job moves (scheduler/job_notices.py): the batches queued on
    Redis, or the one batch given (no Redis)."""
    if events is not None:
        return job_notices_send(events=events)
    return job_notices_drain()


@shared_task(
    name="scheduler.model_availability_refresh",
    ignore_result=True,
    time_limit=60,
    soft_time_limit=50,
)
def model_availability_refresh() -> None:
    """The submit form's and dashboard's availability table, computed off the request path."""
    estimates.model_availability_refresh()
