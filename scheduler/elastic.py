"""Elastic resizes, carried out: the planner's shrinks and grows, and the ones users ask for.

A resize stops the job the way a preemption does, so the workload checkpoints: the job becomes
`preempting` with its `resize` (from, to, reason, the GPUs it keeps) and its agent sends
SIGTERM, waits the job's grace, then SIGKILL (stop reason `resize`). When the exit is reported
the job restarts at the new size with `RESUME=1` and `WORLD_SIZE` its new GPU count:

- a shrink restarts at once on the GPUs it keeps (no cycle in between, nobody can take them);
  the GPUs it gave up go to the job it was shrunk for on the next cycle;
- the planner's grow holds the idle GPUs it was planned into (`resize["hold"]`) while the job
  checkpoints: the cycle counts them as the job's (`holds`, read by `build_state` and by the
  apply step's capacity check), so work that arrives in between does not take them, and the
  job restarts at once on its GPUs and the held ones. If a held GPU became unusable meanwhile
  it is requeued at its new size instead. The hold is part of the resize: it ends with it
  (restarted, requeued, cancelled, its node lost, never confirmed);
- a grow a user asks for holds nothing: it is requeued at its new size and placed by the next
  cycle (which may start it smaller, down to `elastic_min`, if the GPUs are gone).

Each resize is a `JobEvent` with its reason on the way in (`running → preempting`) and out
(`preempting → queued`), and an audit event (`job.resize`, `job.resized`). While a resize is in
flight the job is not `running`, so the cycle does not plan it again (`build_state` hands the
planner no elastic range for it), and a job placed on the GPUs a shrink frees waits with that
reason instead of being planned and dropped cycle after cycle.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, NamedTuple

from django.db import transaction
from django.utils import timezone

from portal.audit import audit_record
from portal.errors import Conflict, DomainError
from portal.models import Role, User
from portal.services import require_role
from scheduler import gangs, ports
from scheduler.core.model import billed_share_milli, gpu_capacity_milli
from scheduler.core.planning.decisions import Resize
from scheduler.cycle.reads import RESIZE_HOLDS
from scheduler.models import Allocation, Gpu, Job, JobState, Node
from scheduler.transitions import job_transition

# What a resize records beyond its event data: the GPUs it keeps and those held for a grow.
_PRIVATE_KEYS = ("keep", "hold")


class Held(NamedTuple):
    """An idle GPU held for a grow in flight: what the job will hold on it."""

    gpu_id: int
    node_id: int
    milli: int
    memory_mib: int


def _held(resize: dict[str, Any]) -> list[Held]:
    return [
        Held(int(h["gpu"]), int(h["node"]), int(h["milli"]), int(h["mem"]))
        for h in resize.get("hold") or ()
    ]


def holds() -> dict[int, list[Held]]:
    """The GPUs held for grows in flight, by job (one read; usually no rows)."""
    out: dict[int, list[Held]] = defaultdict(list)
    for row in RESIZE_HOLDS.rows():
        out[row.job_id] += _held(row.resize)
    return dict(out)


def _public(resize: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in resize.items() if k not in _PRIVATE_KEYS}


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
    hold: Sequence[Held] = (),
) -> None:
    """Stop `job` (locked, running) so that it restarts with `to` GPUs (on `keep`, and on the
    idle GPUs `hold` keeps free for it meanwhile)."""
    frm = len(_current_gpus(job))
    job.resize = {
        "from": frm,
        "to": to,
        "reason": reason,
        "for_job": for_job,
        "by": str(actor) if actor else "scheduler",
        "keep": keep,
    }
    if hold:
        job.resize["hold"] = [
            {"gpu": h.gpu_id, "node": h.node_id, "milli": h.milli, "mem": h.memory_mib}
            for h in hold
        ]
    job.preempt_deadline = now + timedelta(seconds=job.grace_seconds)
    what = _public(job.resize)
    held = f"; {len(hold)} idle GPU(s) held for it meanwhile" if hold else ""
    job_transition(
        job=job,
        to=JobState.PREEMPTING,
        reason=f"Resizing from {frm} to {to} GPUs: {reason}; checkpoint signalled (SIGTERM)" + held,
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
    hold: list[Held] = []
    if resize.for_job is not None:
        reason = f"shrunk to let waiting job {resize.for_job} in"
    else:
        reason = "grown into idle GPUs"
        # The new GPUs are held as the job holds its own (the same share of each).
        milli, mem = Allocation.objects.filter(job=job, ended_at__isnull=True).values_list(
            "share_milli", "memory_mib"
        ).first() or (1000, 0)
        hold = [Held(s.gpu_id, s.node_id, milli, mem) for s in resize.add]
    resize_begin(
        job=job,
        to=resize.gpus,
        keep=keep,
        reason=reason,
        now=now,
        for_job=resize.for_job,
        hold=hold,
    )
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
    hold = _held(r)
    added = _still_free(job, hold) if hold else []
    in_place = (
        len(kept) + len(added) == to
        and (to <= frm or (bool(hold) and len(added) == len(hold)))
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
    what = _public(r)
    if in_place:
        how = (
            "restarts on its GPUs and those held for it" if hold else "restarts on the GPUs it kept"
        )
    elif hold:
        how = "the GPUs held for it are no longer usable; requeued at its new size"
    else:
        how = "requeued at its new size"
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
        _place_again(job, kept, added)


def _still_free(job: Job, hold: list[Held]) -> list[tuple[Held, Gpu]]:
    """The held GPUs (locked, as the cycle's apply locks them) that are still usable and have
    room for the job's share; the job's own allocations do not count against them."""
    gpus = {
        g.pk: g
        for g in Gpu.objects.select_for_update(of=("self",))
        .select_related("node")
        .filter(pk__in=[h.gpu_id for h in hold])
        .order_by("pk")
    }
    used: dict[int, int] = defaultdict(int)
    used_mem: dict[int, int] = defaultdict(int)
    for gpu_id, milli, mem in (
        Allocation.objects.filter(gpu_id__in=list(gpus), ended_at__isnull=True)
        .exclude(job=job)
        .values_list("gpu_id", "share_milli", "memory_mib")
    ):
        used[gpu_id] += milli
        used_mem[gpu_id] += mem
    out = []
    for h in hold:
        g = gpus.get(h.gpu_id)
        if (
            g is not None
            and g.health != Gpu.Health.UNHEALTHY
            and g.node.state == Node.State.READY
            and not g.node.fenced
            and used[g.pk] + h.milli <= gpu_capacity_milli(g.sharing_mode, g.oversubscription)
            and used_mem[g.pk] + h.memory_mib <= g.memory_mib
        ):
            out.append((h, g))
    return out


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
        data={"resize": _public(r)},
        update_fields=("gpus", "resume", "resize", "preempt_deadline"),
    )
    audit_record(
        actor=None,
        action="job.resized",
        target=job,
        project=job.project,
        data=_public(r),
    )


def _place_again(job: Job, kept: list[Allocation], added: list[tuple[Held, Gpu]]) -> None:
    """The next attempt of the (queued) job on the GPUs it kept and those held for it, at once."""
    now = timezone.now()
    attempt = job.attempt + 1
    rows = [
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
    borrowed = kept[0].borrowed if kept else job.borrowed
    rows += [
        Allocation(
            job=job,
            gpu_id=g.pk,
            node_id=g.node_id,
            attempt=attempt,
            share_milli=h.milli,
            memory_mib=h.memory_mib,
            billed_milli=billed_share_milli(
                h.milli,
                gpu_capacity_milli(g.sharing_mode, g.oversubscription),
                h.memory_mib,
                g.memory_mib,
            ),
            gpu_model_id=g.model_id,
            borrowed=borrowed,
            started_at=now,
        )
        for h, g in added
    ]
    Allocation.objects.bulk_create(rows)
    index = {a.gpu_id: a.gpu.index for a in kept} | {g.pk: g.index for _, g in added}
    per_node: dict[int, int] = {}
    for a in sorted(rows, key=lambda a: (a.node_id, index[a.gpu_id])):  # rank order
        per_node[a.node_id] = per_node.get(a.node_id, 0) + 1
    port = gangs.members_create([(job.pk, attempt, list(per_node.items()))], now=now)
    job.attempt = attempt
    job.rendezvous_port = port.get(job.pk)
    job.pending_reason = job.pending_message = ""
    job.queue_position = None
    job.estimated_start_at = None
    names = sorted(set(Node.objects.filter(pk__in=per_node).values_list("name", flat=True)))
    job_transition(
        job=job,
        to=JobState.SCHEDULED,
        reason=f"Placed on {', '.join(names)} at its new size ({len(rows)} GPUs)",
        actor_label="scheduler",
        data={"gpus": [a.gpu_id for a in rows], "attempt": attempt},
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
