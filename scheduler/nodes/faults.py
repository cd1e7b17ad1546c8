"""What a platform fault does to the jobs it hits: lost, then requeued or failed."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import QuerySet
from django.utils import timezone

from portal.audit import audit_record
from portal.models import User
from scheduler.models import Allocation, Gpu, Job, JobState, NodeEvent
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
    restartable = job.preemptible or job.has_checkpoint or job.restarts < job.max_restarts
    if restartable and job.restarts < MAX_FAULT_RESTARTS:
        job.restarts += 1
        job.resume = job.has_checkpoint
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
            f"{why}; the job may not restart (no checkpoint volume, not preemptible, "
            "no restarts left)"
        )[:500]
        job_transition(
            job=job,
            to=JobState.FAILED,
            reason=job.failure_reason,
            actor_label=actor,
            update_fields=("failure_reason",),
        )


def gpu_fault_record(gpu: Gpu, *, at: datetime) -> None:
    """A new fault on `gpu` (it became unhealthy, or its device was replaced): not yet
    corroborated, so the work it ends is not credited yet. The caller saves the GPU."""
    gpu.fault_at, gpu.fault_corroborated_at = at, None


def gpu_fault_corroborate(
    gpu: Gpu, *, how: str, actor: User | None = None, remote_addr: str | None = None
) -> int:
    """Corroborate the GPU's open fault: the attempts it ended (on every GPU they held) become
    creditable, which billing's metering then credits. Returns the allocations corroborated;
    audited, with how it was corroborated (`heartbeat` or `operator`)."""
    if gpu.fault_at is None or gpu.fault_corroborated_at is not None:
        return 0
    now = timezone.now()
    gpu.fault_corroborated_at = now
    gpu.save(update_fields=["fault_corroborated_at"])
    hit = Allocation.objects.filter(
        gpu=gpu, end_reason=Allocation.EndReason.GPU_FAULT, ended_at__gte=gpu.fault_at
    ).values_list("job_id", "attempt")
    total = 0
    for job_id, attempt in set(hit):
        total += Allocation.objects.filter(
            job_id=job_id,
            attempt=attempt,
            end_reason=Allocation.EndReason.GPU_FAULT,
            fault_corroborated_at__isnull=True,
        ).update(fault_corroborated_at=now)
    NodeEvent.objects.create(
        node_id=gpu.node_id,
        gpu=gpu,
        kind="gpu_fault_corroborated",
        message=f"GPU {gpu.index}'s fault corroborated ({how}); "
        f"{total} allocation(s) it ended may be credited",
    )
    audit_record(
        actor=actor,
        action="gpu.fault_corroborated",
        target=gpu,
        data={"how": how, "fault_at": gpu.fault_at.isoformat(), "allocations": total},
        remote_addr=remote_addr,
    )
    return total
