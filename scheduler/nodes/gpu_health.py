"""Acting on a GPU's health assessment: mark the GPU, fail the job that caused an XID, move
work off an unhealthy GPU, and mark the node unhealthy when none of its GPUs is left."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings

from portal.audit import audit_record
from scheduler import gpu_health_rules
from scheduler.models import Allocation, Gpu, JobState, Node, NodeEvent
from scheduler.nodes.faults import (
    gpu_fault_corroborate,
    gpu_fault_record,
    jobs_holding,
    requeue_after_fault,
)
from scheduler.nodes.states import node_transition
from scheduler.transitions import job_transition


def gpu_health_apply(
    node: Node,
    gpu: Gpu,
    assessment: gpu_health_rules.Assessment,
    *,
    at: datetime,
    received: datetime,
) -> None:
    """Act on one GPU's assessment of a sample taken `at` (in a heartbeat `received` then):
    mark it, move its work, record and alert. A fault is recorded when the heartbeat that
    reported it arrived; it is corroborated by a sample taken after that, in a heartbeat that
    arrives at least GPU_FAULT_CORROBORATION_SECONDS later, that still finds the GPU unhealthy
    (so one heartbeat, whatever the ages of its samples, cannot corroborate itself)."""
    for xid in assessment.job_fault_xids:
        _application_fault(node, gpu, xid)
    new = assessment.gpu.value
    current = gpu.health
    if (
        current == Gpu.Health.UNHEALTHY
        and new == Gpu.Health.UNHEALTHY
        and gpu.fault_at is not None
        and at >= gpu.fault_at
        and received - gpu.fault_at >= timedelta(seconds=settings.GPU_FAULT_CORROBORATION_SECONDS)
    ):
        gpu_fault_corroborate(gpu, how="heartbeat")  # still unhealthy on a later heartbeat
    if new == current or (current == Gpu.Health.UNHEALTHY and new != Gpu.Health.UNHEALTHY):
        return  # unhealthy is sticky: an operator resets it after looking at the GPU
    reasons = _mark_gpu(node, gpu, assessment, received=received)
    if new == Gpu.Health.UNHEALTHY:
        _move_work_off(node, gpu, reasons)


def _application_fault(node: Node, gpu: Gpu, xid: int) -> None:
    """An XID the job caused: recorded; the one job on the GPU fails (on a shared GPU the
    culprit is unknown, so nothing is guessed)."""
    jobs = list(jobs_holding(gpu=gpu).filter(state__in=[JobState.STARTING, JobState.RUNNING]))
    NodeEvent.objects.create(
        node=node,
        gpu=gpu,
        severity=NodeEvent.Severity.WARNING,
        kind=f"xid_{xid}",
        message=f"XID {xid} on GPU {gpu.index}: an application fault; the GPU stays in service",
    )
    if len(jobs) == 1:
        job = jobs[0]
        job.failure_reason = f"The job caused GPU error XID {xid} (an application fault)"
        job_transition(
            job=job,
            to=JobState.FAILED,
            reason=job.failure_reason,
            actor_label=f"health:{node.name}",
            update_fields=("failure_reason",),
        )


def _mark_gpu(
    node: Node, gpu: Gpu, assessment: gpu_health_rules.Assessment, *, received: datetime
) -> str:
    """The GPU takes its new health (a fault recorded when it turns unhealthy), with a node
    event and an audit record; the reasons in words."""
    new = assessment.gpu.value
    gpu.health = new
    if new == Gpu.Health.UNHEALTHY:
        gpu_fault_record(gpu, at=received)
    gpu.save(update_fields=["health", "fault_at", "fault_corroborated_at"])
    reasons = "; ".join(assessment.reasons) or "back to normal"
    severities: dict[str, str] = {
        Gpu.Health.UNHEALTHY: NodeEvent.Severity.CRITICAL,
        Gpu.Health.DEGRADED: NodeEvent.Severity.WARNING,
    }
    NodeEvent.objects.create(
        node=node,
        gpu=gpu,
        severity=severities.get(new, NodeEvent.Severity.INFO),
        kind=f"gpu_{new}",
        message=f"GPU {gpu.index} ({gpu.uuid}) {new}: {reasons}",
    )
    audit_record(
        actor=None, action=f"gpu.{new}", target=gpu, data={"reasons": list(assessment.reasons)}
    )
    return reasons


def _move_work_off(node: Node, gpu: Gpu, reasons: str) -> None:
    """An unhealthy GPU: its jobs are requeued, and a node left with no healthy GPU is marked
    unhealthy (it takes no new work)."""
    faulted = jobs_holding(gpu=gpu).exclude(
        state__in=[JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]
    )
    for job in faulted:
        requeue_after_fault(
            job,
            f"GPU {gpu.index} on {node.name} became unhealthy ({reasons})",
            end_reason=Allocation.EndReason.GPU_FAULT,
            actor=f"health:{node.name}",
        )
    healthy_left = node.gpus.exclude(health=Gpu.Health.UNHEALTHY).exists()
    if not healthy_left and node.state == Node.State.READY:
        node_transition(
            node=node,
            to=Node.State.UNHEALTHY,
            kind="node_unhealthy",
            severity=NodeEvent.Severity.CRITICAL,
            message="Every GPU of the node is unhealthy; it takes no new work",
        )
