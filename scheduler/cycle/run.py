"""One whole cycle, its steps in order: settle → read and build the state → plan → apply.

Before it plans, a cycle settles what needs no plan: preemptions never confirmed are requeued,
dependencies are settled, and the queued jobs of Slurm pools are handed to Slurm.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

import scheduler.cycle.reads as reads
from scheduler import backends, elastic
from scheduler.cycle.apply import CycleResult, apply_plan, record_pending
from scheduler.cycle.plan import orders_by_fair_share, plan_cycle, policy_config
from scheduler.cycle.state import build_state
from scheduler.dependencies import dependencies_settle
from scheduler.models import Job, JobState
from scheduler.transitions import job_transition


def run_cycle(*, now: datetime | None = None) -> CycleResult:
    """One whole cycle: snapshot → plan → apply. Callers hold the single-flight lock.

    With nothing queued there is nothing to decide, so the snapshot is not read at all.
    """
    started = time.perf_counter()
    now = now or timezone.now()
    queued = _settle(now=now)
    result = CycleResult()
    # Elastic work below its maximum may grow into idle GPUs even when nothing is queued.
    if "agents" in queued or "elastic" in queued:
        config = policy_config()
        state = build_state(now=now, with_usage=orders_by_fair_share(config))
        if state.queue or config.elastic:
            decided = plan_cycle(state, config, now=now)
            result = apply_plan(decided, state, now=now)
            record_pending(decided, state, set(result.placed), result.waiting)
    result.seconds = time.perf_counter() - started
    return result


def _settle(*, now: datetime) -> set[str]:
    """What a cycle does before it plans; returns the kinds of work queued then."""
    expire_stale_preemptions(now=now)
    queued = reads.queued_kinds()
    if "dependencies" in queued:
        settled = dependencies_settle()
        for job in Job.objects.filter(pk__in=settled.failed).select_related("pool"):
            if backends.is_external(job):
                backends.cancel(job)  # scancel what Slurm holds for a dependency never met
        if settled.released:
            queued = reads.queued_kinds()  # released jobs are planned (or handed over) now
    if "slurm" in queued:
        backends.handoff()  # queued jobs of Slurm pools go to Slurm (its scheduler places them)
    return queued


def expire_stale_preemptions(*, now: datetime) -> list[int]:
    """Preempting jobs whose agent never confirmed the stop: requeue them once well past grace.

    The node's agent kills anything the portal no longer assigns to it, so the GPUs are free.
    Most cycles find none, which one unlocked read tells without opening a transaction.
    """
    cutoff = now - timedelta(seconds=60)
    if not reads.OVERDUE_PREEMPTION.rows(cutoff=cutoff):
        return []
    return _requeue_overdue_preemptions(cutoff)


@transaction.atomic
def _requeue_overdue_preemptions(cutoff: datetime) -> list[int]:
    overdue = Job.objects.select_for_update().filter(
        state=JobState.PREEMPTING, preempt_deadline__lt=cutoff
    )
    requeued = []
    for job in overdue:
        if job.resize:  # a resize the node never confirmed: requeued at its new size
            elastic.resize_unconfirmed(job)
            requeued.append(job.pk)
            continue
        job.resume = job.has_checkpoint
        job_transition(
            job=job,
            to=JobState.QUEUED,
            reason="Preemption grace period over without confirmation from the node; requeued",
            actor_label="scheduler",
            update_fields=("resume",),
        )
        requeued.append(job.pk)
    return requeued
