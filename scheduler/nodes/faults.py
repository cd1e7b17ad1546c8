"""What a platform fault does to the jobs it hits: lost, then requeued or failed."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet

from scheduler.models import Allocation, Job, JobState
from scheduler.transitions import job_transition

MAX_FAULT_RESTARTS = 10  # a job requeued this often after faults fails instead of looping


def jobs_holding(**where: Any) -> QuerySet[Job]:
    """Jobs with an active allocation matching `where`, locked in id order."""
    ids = Allocation.objects.filter(ended_at__isnull=True, **where).values_list("job_id", flat=True)
    return Job.objects.select_for_update().filter(pk__in=list(ids)).order_by("pk")


def requeue_after_fault(job: Job, why: str, *, end_reason: str, actor: str) -> None:
    """A platform fault took the job's GPUs: it becomes lost, then is requeued or failed."""
    if job.is_terminal or job.state == JobState.LOST:
        return
    job_transition(job=job, to=JobState.LOST, reason=why, actor_label=actor, end_reason=end_reason)
    restartable = job.preemptible or bool(job.checkpoint_dir) or job.restarts < job.max_restarts
    if restartable and job.restarts < MAX_FAULT_RESTARTS:
        job.restarts += 1
        job.resume = bool(job.checkpoint_dir)
        job_transition(
            job=job,
            to=JobState.QUEUED,
            reason="Requeued after a platform fault"
            + (" (resumes from checkpoint)" if job.resume else ""),
            actor_label=actor,
            update_fields=("restarts", "resume"),
        )
    else:
        job.failure_reason = (
            f"{why}; the job may not restart (no checkpoint directory, not preemptible, "
            "no restarts left)"
        )[:500]
        job_transition(
            job=job,
            to=JobState.FAILED,
            reason=job.failure_reason,
            actor_label=actor,
            update_fields=("failure_reason",),
        )
