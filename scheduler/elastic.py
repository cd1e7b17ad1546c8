"""Elastic resizes, carried out: the planner's shrinks and grows, and the ones users ask for.

A resize stops the job the way a preemption does, so the workload checkpoints: the job becomes
`preempting` with its `resize` (from, to, reason, the GPUs it keeps) and its agent sends
SIGTERM, waits the job's grace, then SIGKILL (stop reason `resize`). When the exit is reported
the job restarts at the new size with `RESUME=1` and `WORLD_SIZE` its new GPU count:

- a shrink restarts at once on the GPUs it keeps (no cycle in between, nobody can take them);
  the GPUs it gave up go to the job it was shrunk for on the next cycle;
- a grow is requeued at its new size and placed by the next cycle (the idle GPUs it was
  planned into are not held while it stops; if they are gone it may start smaller, down to
  `elastic_min`).

Each resize is a `JobEvent` with its reason on the way in (`running → preempting`) and out
(`preempting → queued`), and an audit event (`job.resize`, `job.resized`). While a resize is in
flight the job is not `running`, so the cycle does not plan it again (`build_state` hands the
planner no elastic range for it), and a job placed on the GPUs a shrink frees waits with that
reason instead of being planned and dropped cycle after cycle.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from portal.audit import audit_record
from portal.errors import Conflict, DomainError
from portal.models import Role, User
from portal.services import require_role
from scheduler import gangs, ports
from scheduler.core.planning.decisions import Resize
from scheduler.models import Allocation, Gpu, Job, JobState, Node
from scheduler.transitions import job_transition


def _current_gpus(job: Job) -> list[int]:
    """The job's GPUs now, in rank order (node, then index)."""
    return list(
        Allocation.objects.filter(job=job, ended_at__isnull=True)
        .order_by("node_id", "gpu__index")
        .values_list("gpu_id", flat=True)
    )


def resize_begin(
    *,
    job: Job,
    to: int,
    keep: list[int],
    reason: str,
    now: datetime,
    actor: User | None = None,
    for_job: int | None = None,
    remote_addr: str | None = None,
) -> None:
    """Stop `job` (locked, running) so that it restarts with `to` GPUs."""
    frm = len(_current_gpus(job))
    job.resize = {
        "from": frm,
        "to": to,
        "reason": reason,
        "for_job": for_job,
        "by": str(actor) if actor else "scheduler",
        "keep": keep,
    }
    job.preempt_deadline = now + timedelta(seconds=job.grace_seconds)
    what = {k: v for k, v in job.resize.items() if k != "keep"}
    job_transition(
        job=job,
        to=JobState.PREEMPTING,
        reason=f"Resizing from {frm} to {to} GPUs: {reason}; checkpoint signalled (SIGTERM)",
        actor=actor,
        actor_label=None if actor else "scheduler",
        data={"resize": what},
        update_fields=("resize", "preempt_deadline"),
    )
    audit_record(
        actor=actor,
        action="job.resize",
        target=job,
        project=job.project,
        data=what,
        remote_addr=remote_addr,
    )


def resize_planned(resize: Resize, *, now: datetime) -> bool:
    """Carry out one of the plan's resizes (inside the cycle's transaction); False when the
    job no longer runs as planned (it ended, or another resize is in flight)."""
    job = (
        Job.objects.select_for_update()
        .select_related("project")
        .filter(pk=resize.job_id, state=JobState.RUNNING, elastic_min__isnull=False)
        .first()
    )
    if job is None or job.resize:
        return False
    current = _current_gpus(job)
    released = {s.gpu_id for s in resize.release}
    keep = [g for g in current if g not in released] + [s.gpu_id for s in resize.add]
    if resize.for_job is not None:
        reason = f"shrunk to let waiting job {resize.for_job} in"
    else:
        reason = "grown into idle GPUs"
    resize_begin(job=job, to=resize.gpus, keep=keep, reason=reason, now=now, for_job=resize.for_job)
    return True


@transaction.atomic
def job_resize_request(*, actor: User, job: Job, gpus: int, remote_addr: str | None = None) -> Job:
    """A user asks for their elastic job to run on `gpus` GPUs from now on."""
    require_role(user=actor, project=job.project, roles=(Role.OWNER, Role.MEMBER))
    job = Job.objects.select_for_update().select_related("project").get(pk=job.pk)
    if job.elastic_min is None and job.elastic_max is None:
        raise DomainError(
            "Only an elastic job (elastic_min/elastic_max) can be resized.",
            code="not_elastic",
            field="gpus",
        )
    lo, hi = job.elastic_min or job.gpus, job.elastic_max or job.gpus
    if not lo <= gpus <= hi:
        raise DomainError(
            f"This job runs on {lo} to {hi} GPUs; {gpus} is outside that range.",
            code="out_of_range",
            field="gpus",
        )
    if job.resize:
        raise Conflict(
            f"A resize to {job.resize.get('to')} GPUs is already under way.",
            code="resize_in_flight",
        )
    if job.state != JobState.RUNNING:
        raise Conflict(
            f"Job {job.pk} is {job.state}; only a running job can be resized.",
            code="not_running",
        )
    current = _current_gpus(job)
    if gpus == len(current):
        raise DomainError(f"The job already runs on {gpus} GPUs.", code="same_size", field="gpus")
    resize_begin(
        job=job,
        to=gpus,
        keep=current[:gpus],
        reason=f"asked for by {actor.email}",
        now=timezone.now(),
        actor=actor,
        remote_addr=remote_addr,
    )
    return job


def resize_finish(*, job: Job, label: str, data: dict[str, Any], exit_code: int | None) -> None:
    """The resized job (locked, preempting) stopped: restart it at its new size."""
    r = dict(job.resize)
    frm, to = int(r["from"]), int(r["to"])
    keep_ids = set(r.get("keep") or ())
    kept = list(
        Allocation.objects.filter(job=job, ended_at__isnull=True, gpu_id__in=keep_ids)
        .select_related("gpu", "node")
        .order_by("node_id", "gpu__index")
    )
    in_place = (
        to <= frm
        and len(kept) == to
        and all(
            a.gpu.health != Gpu.Health.UNHEALTHY
            and a.node.state == Node.State.READY
            and not a.node.fenced
            for a in kept
        )
    )
    job.gpus = to
    job.resume = True
    job.resize = {}
    job.preempt_deadline = None
    job.exit_code = exit_code
    what = {k: v for k, v in r.items() if k != "keep"}
    how = "restarts on the GPUs it kept" if in_place else "requeued at its new size"
    job_transition(
        job=job,
        to=JobState.QUEUED,
        reason=f"Resized from {frm} to {to} GPUs ({r['reason']}); {how}, resuming from its "
        "checkpoint (RESUME=1)",
        actor_label=label,
        data={**data, "resize": what},
        end_reason=Allocation.EndReason.PREEMPTED,
        update_fields=("gpus", "resume", "resize", "preempt_deadline", "exit_code"),
    )
    audit_record(actor=None, action="job.resized", target=job, project=job.project, data=what)
    if in_place:
        _place_again(job, kept)


def resize_unconfirmed(job: Job) -> None:
    """A resize whose stop the node never confirmed (past the grace): requeued at the new
    size (the node's agent kills what it is no longer assigned)."""
    r = dict(job.resize)
    job.gpus = int(r["to"])
    job.resume = True
    job.resize = {}
    job.preempt_deadline = None
    job_transition(
        job=job,
        to=JobState.QUEUED,
        reason=f"Resized from {r['from']} to {r['to']} GPUs ({r['reason']}) without "
        "confirmation from the node; requeued at its new size",
        actor_label="scheduler",
        data={"resize": {k: v for k, v in r.items() if k != "keep"}},
        update_fields=("gpus", "resume", "resize", "preempt_deadline"),
    )
    audit_record(
        actor=None,
        action="job.resized",
        target=job,
        project=job.project,
        data={k: v for k, v in r.items() if k != "keep"},
    )


def _place_again(job: Job, kept: list[Allocation]) -> None:
    """The next attempt of the (queued) job on the GPUs it kept, at once."""
    now = timezone.now()
    attempt = job.attempt + 1
    Allocation.objects.bulk_create(
        [
            Allocation(
                job=job,
                gpu_id=a.gpu_id,
                node_id=a.node_id,
                attempt=attempt,
                share_milli=a.share_milli,
                memory_mib=a.memory_mib,
                billed_milli=a.billed_milli,  # the same share of the same GPU bills the same
                gpu_model_id=a.gpu_model_id,
                borrowed=a.borrowed,
                started_at=now,
            )
            for a in kept
        ]
    )
    per_node: dict[int, int] = {}
    for a in kept:
        per_node[a.node_id] = per_node.get(a.node_id, 0) + 1
    port = gangs.members_create([(job.pk, attempt, list(per_node.items()))], now=now)
    job.attempt = attempt
    job.rendezvous_port = port.get(job.pk)
    job.pending_reason = job.pending_message = ""
    job.queue_position = None
    job.estimated_start_at = None
    names = sorted({a.node.name for a in kept})
    job_transition(
        job=job,
        to=JobState.SCHEDULED,
        reason=f"Placed on {', '.join(names)} at its new size ({len(kept)} GPUs)",
        actor_label="scheduler",
        data={"gpus": [a.gpu_id for a in kept], "attempt": attempt},
        update_fields=(
            "attempt",
            "rendezvous_port",
            "pending_reason",
            "pending_message",
            "queue_position",
            "estimated_start_at",
        ),
    )
    ports.allocations_changed(node_ids=set(per_node))
