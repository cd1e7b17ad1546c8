"""Node services: agent registration, heartbeats, job reports from agents, health, cordon/drain.

Everything an agent can do goes through here, scoped to its own node.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import IntegrityError, transaction
from django.db.models import F, QuerySet
from django.utils import timezone

from portal.audit import audit_record
from portal.db import AnyOf, CompiledQuery, concrete_columns, instance_from_row
from portal.errors import Conflict, DomainError
from portal.models import User
from scheduler import health, ports
from scheduler.cycle_requests import request_cycle
from scheduler.dispatch import assignments_changed
from scheduler.models import Allocation, Gpu, GpuModel, Job, JobState, LogChunk, Node, NodeEvent
from scheduler.selectors import telemetry_key
from scheduler.transitions import job_transition, jobs_transition_bulk

log = logging.getLogger(__name__)

AGENT_TOKEN_PREFIX = "gpn_"
TELEMETRY_TTL_S = 120
MAX_FAULT_RESTARTS = 10  # a job requeued this often after faults fails instead of looping


def agent_token_hash(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


AGENT_TOKEN_TTL_S = 30  # how long a token's node is remembered in the cache


def agent_token_key(token_hash: str) -> str:
    """The cache key remembering which node a token hash names."""
    return f"scheduler:agent-token:{token_hash}"


def agent_token_forget(token_hash: str) -> None:
    """The cache stops vouching for this token hash (issued anew, node retired)."""
    if token_hash:
        cache.delete(agent_token_key(token_hash))


@transaction.atomic
def node_issue_agent_token(*, node: Node, actor: User | None = None) -> str:
    """A new agent token for the node (the old one stops working). Shown once."""
    raw = AGENT_TOKEN_PREFIX + secrets.token_urlsafe(32)
    old = Node.objects.filter(pk=node.pk).values_list("agent_token_hash", flat=True).first()
    Node.objects.filter(pk=node.pk).update(agent_token_hash=agent_token_hash(raw))
    node.agent_token_hash = agent_token_hash(raw)
    if old:
        transaction.on_commit(lambda: agent_token_forget(old))
    audit_record(actor=actor, action="node.token_issue", target=node)
    return raw


# Compiled once (`CompiledQuery`): every agent request that touches its node's data asks.
_NODE_BY_TOKEN = CompiledQuery(
    lambda token_hash: (
        Node.objects.filter(agent_token_hash=token_hash)
        .exclude(state=Node.State.RETIRED)
        .order_by("pk")
        .values_list(*concrete_columns(Node))[:1]
    )
)
_NODE_BY_TOKEN_AND_ID = CompiledQuery(
    lambda token_hash, node_id: (
        Node.objects.filter(agent_token_hash=token_hash, pk=node_id)
        .exclude(state=Node.State.RETIRED)
        .values_list(*concrete_columns(Node))[:1]
    )
)


def node_for_agent_token_hash(token_hash: str, node_id: int | None = None) -> Node | None:
    """The node this token hash belongs to, read from the database (not retired)."""
    rows = (
        _NODE_BY_TOKEN.rows(token_hash=token_hash)
        if node_id is None
        else _NODE_BY_TOKEN_AND_ID.rows(token_hash=token_hash, node_id=node_id)
    )
    return instance_from_row(Node, rows[0]) if rows else None


def node_id_for_agent_token(raw: str) -> tuple[int, str] | None:
    """(node id, token hash) for an agent token, remembered in the cache for a few seconds.

    Only the id comes from the cache: whoever needs the node loads it with
    `node_for_agent_token_hash(hash, node_id)`, which checks the token again in the database.
    """
    if not raw.startswith(AGENT_TOKEN_PREFIX) or len(raw) > 200:
        return None
    token_hash = agent_token_hash(raw)
    key = agent_token_key(token_hash)
    node_id = cache.get(key)
    if not isinstance(node_id, int):
        node = node_for_agent_token_hash(token_hash)
        if node is None:
            return None
        node_id = node.pk
        cache.set(key, node_id, timeout=AGENT_TOKEN_TTL_S)
    return node_id, token_hash


def gpu_model_for_product(product: str) -> GpuModel | None:
    """Map an NVML product name (or a catalog name) to the catalog."""
    for model in GpuModel.objects.all():
        if product == model.name or product in model.nvml_names:
            return model
    return None


@transaction.atomic
def node_register(*, node: Node, inventory: dict[str, Any]) -> Node:
    """Record the inventory an agent reports. GPUs are matched by UUID; unknown products refused."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    gpus = inventory["gpus"]
    models = {}
    for gpu in gpus:
        model = gpu_model_for_product(gpu["name"])
        if model is None:
            raise DomainError(
                f"GPU product '{gpu['name']}' is not in the catalog; an operator must add it "
                "(or its NVML name) first.",
                field="gpus",
            )
        models[gpu["uuid"]] = model
    indexes = [g["index"] for g in gpus]
    if len(set(indexes)) != len(indexes) or len({g["uuid"] for g in gpus}) != len(gpus):
        raise DomainError("GPU indexes and UUIDs must be unique on a node.", field="gpus")
    taken = Gpu.objects.filter(uuid__in=[g["uuid"] for g in gpus]).exclude(node=node)
    if taken.exists():
        raise Conflict("A GPU UUID in this inventory belongs to another node.")
    # A Gpu row is a slot (node, index); the device in it may be replaced (a new UUID).
    slots = {g.index: g for g in node.gpus.all()}
    replaced = [
        (slots[g["index"]], g)
        for g in gpus
        if g["index"] in slots and slots[g["index"]].uuid != g["uuid"]
    ]
    for row, _ in replaced:  # free the old UUIDs first: two slots may swap devices
        row.uuid = f"replaced-{row.pk}"
        row.save(update_fields=["uuid"])
    for row, reported in replaced:
        for job in _jobs_holding(gpu=row):
            _requeue_after_fault(
                job,
                f"GPU {row.index} on {node.name} was replaced",
                end_reason=Allocation.EndReason.GPU_FAULT,
                actor=f"agent:{node.name}",
            )
        NodeEvent.objects.create(
            node=node,
            gpu=row,
            kind="gpu_replaced",
            message=f"GPU {row.index} now reports UUID {reported['uuid']}",
        )
        row.health = Gpu.Health.HEALTHY
    for gpu in gpus:
        slot = slots.get(gpu["index"])
        if slot is None:
            Gpu.objects.create(
                node=node,
                index=gpu["index"],
                uuid=gpu["uuid"],
                model=models[gpu["uuid"]],
                memory_mib=gpu["memory_mib"],
                sharing_mode=Gpu.SharingMode.MIG
                if gpu.get("mig_mode")
                else Gpu.SharingMode.EXCLUSIVE,
            )
            continue
        slot.uuid, slot.model, slot.memory_mib = gpu["uuid"], models[gpu["uuid"]], gpu["memory_mib"]
        slot.save(update_fields=["uuid", "model", "memory_mib", "health"])
    for index, row in slots.items():  # a device that vanished: unhealthy, not deleted
        if index not in indexes and row.health != Gpu.Health.UNHEALTHY:
            row.health = Gpu.Health.UNHEALTHY
            row.save(update_fields=["health"])
            NodeEvent.objects.create(
                node=node,
                gpu=row,
                severity=NodeEvent.Severity.CRITICAL,
                kind="gpu_missing",
                message=f"GPU {index} is missing from the node's inventory",
            )
    node.driver_version = inventory.get("driver_version", "")[:32]
    node.cuda_version = inventory.get("cuda_version", "")[:16]
    if inventory.get("cpu_milli"):
        node.cpu_milli = inventory["cpu_milli"]
    if inventory.get("memory_mib"):
        node.memory_mib = inventory["memory_mib"]
    node.last_heartbeat_at = timezone.now()
    came_back = node.state == Node.State.LOST
    if node.state in (Node.State.PROVISIONING, Node.State.LOST):
        node.state = Node.State.READY
    node.save()
    assignments_changed([node.pk])  # GPU slots may hold other devices now
    audit_record(
        actor=None,
        action="node.register",
        target=node,
        data={"gpus": len(gpus), "came_back": came_back, "driver": node.driver_version},
    )
    return node


@transaction.atomic
def node_heartbeat(
    *, node: Node, telemetry: list[dict[str, Any]], running: list[dict[str, Any]]
) -> Node:
    """Record liveness and the latest telemetry; a lost node that returns is fenced."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    now = timezone.now()
    node.last_heartbeat_at = now
    fields = ["last_heartbeat_at", "updated_at"]
    if node.state == Node.State.LOST:
        node.state = Node.State.READY
        node.fenced = True
        fields += ["state", "fenced"]
        audit_record(actor=None, action="node.return_fenced", target=node)
    if node.fenced and not running:
        node.fenced = False
        fields.append("fenced")
        audit_record(actor=None, action="node.unfence", target=node)
    if "fenced" in fields:
        assignments_changed([node.pk])
    node.save(update_fields=fields)
    gpus = {g.uuid: g for g in node.gpus.all()}
    newest: dict[str, dict[str, Any]] = {}  # a heartbeat carries several instants per GPU
    for s in telemetry:
        seen = newest.get(s.get("uuid", ""))
        if s.get("uuid") in gpus and (seen is None or s.get("age_s", 0) <= seen.get("age_s", 0)):
            newest[s["uuid"]] = s
    cache.set_many(
        {
            telemetry_key(gpus[uuid].pk): {
                **s,
                "at": (now - timedelta(seconds=float(s.get("age_s") or 0))).isoformat(),
            }
            for uuid, s in newest.items()
        },
        timeout=TELEMETRY_TTL_S,
    )
    for sample in telemetry:
        gpu = gpus.get(sample.get("uuid", ""))
        if gpu is not None:
            _apply_health(node, gpu, health.assess(sample))
    known = [{**s, "gpu_id": gpus[s["uuid"]].pk} for s in telemetry if s.get("uuid") in gpus]
    for sink in ports.TELEMETRY_SINKS:
        sink(node=node, samples=known, now=now)
    return node


def _jobs_holding(**where: Any) -> QuerySet[Job]:
    """Jobs with an active allocation matching `where`, locked in id order."""
    ids = Allocation.objects.filter(ended_at__isnull=True, **where).values_list("job_id", flat=True)
    return Job.objects.select_for_update().filter(pk__in=list(ids)).order_by("pk")


def _apply_health(node: Node, gpu: Gpu, assessment: health.Assessment) -> None:
    """Act on one GPU's assessment: mark it, move its work, record and alert."""
    for xid in assessment.job_fault_xids:
        jobs = list(_jobs_holding(gpu=gpu).filter(state__in=[JobState.STARTING, JobState.RUNNING]))
        NodeEvent.objects.create(
            node=node,
            gpu=gpu,
            severity=NodeEvent.Severity.WARNING,
            kind=f"xid_{xid}",
            message=f"XID {xid} on GPU {gpu.index}: an application fault; the GPU stays in service",
        )
        if len(jobs) == 1:  # on a shared GPU the culprit is unknown: record, do not guess
            job = jobs[0]
            job.failure_reason = f"The job caused GPU error XID {xid} (an application fault)"
            job_transition(
                job=job,
                to=JobState.FAILED,
                reason=job.failure_reason,
                actor_label=f"health:{node.name}",
                update_fields=("failure_reason",),
            )
    new = assessment.gpu.value
    current = gpu.health
    if new == current or (current == Gpu.Health.UNHEALTHY and new != Gpu.Health.UNHEALTHY):
        return  # unhealthy is sticky: an operator resets it after looking at the GPU
    gpu.health = new
    gpu.save(update_fields=["health"])
    reasons = "; ".join(assessment.reasons) or "back to normal"
    severities: dict[str, str] = {
        Gpu.Health.UNHEALTHY: NodeEvent.Severity.CRITICAL,
        Gpu.Health.DEGRADED: NodeEvent.Severity.WARNING,
    }
    severity = severities.get(new, NodeEvent.Severity.INFO)
    NodeEvent.objects.create(
        node=node,
        gpu=gpu,
        severity=severity,
        kind=f"gpu_{new}",
        message=f"GPU {gpu.index} ({gpu.uuid}) {new}: {reasons}",
    )
    audit_record(
        actor=None, action=f"gpu.{new}", target=gpu, data={"reasons": list(assessment.reasons)}
    )
    if new != Gpu.Health.UNHEALTHY:
        return
    faulted = _jobs_holding(gpu=gpu).exclude(
        state__in=[JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED]
    )
    for job in faulted:
        _requeue_after_fault(
            job,
            f"GPU {gpu.index} on {node.name} became unhealthy ({reasons})",
            end_reason=Allocation.EndReason.GPU_FAULT,
            actor=f"health:{node.name}",
        )
    healthy_left = node.gpus.exclude(health=Gpu.Health.UNHEALTHY).exists()
    if not healthy_left and node.state == Node.State.READY:
        node.state = Node.State.UNHEALTHY
        node.save(update_fields=["state", "updated_at"])
        NodeEvent.objects.create(
            node=node,
            severity=NodeEvent.Severity.CRITICAL,
            kind="node_unhealthy",
            message="Every GPU of the node is unhealthy; it takes no new work",
        )


_ASSIGNED = CompiledQuery(
    lambda node_id: (
        Allocation.objects.filter(
            node_id=node_id,
            ended_at__isnull=True,
            job__state__in=[
                JobState.SCHEDULED,
                JobState.STARTING,
                JobState.RUNNING,
                JobState.PREEMPTING,
            ],
        )
        .order_by("job_id", "gpu__index")
        .values_list(
            "job_id",
            "share_milli",
            "memory_mib",
            "gpu__uuid",
            "job__attempt",
            "job__state",
            "job__command",
            "job__env",
            "job__checkpoint_dir",
            "job__resume",
            "job__shard_index",
            "job__shard_count",
            "job__working_dir",
            "job__grace_seconds",
        )
    )
)


def assignments_for(node: Node) -> list[dict[str, Any]]:
    """What the node must run or stop: jobs with active allocations on it (one compiled
    query: every agent reads this whenever its assignments change)."""
    if node.fenced:
        return []
    by_job: dict[int, list[tuple[Any, ...]]] = {}
    for row in _ASSIGNED.rows(node_id=node.pk):
        by_job.setdefault(row[0], []).append(row)
    out = []
    for job_id, rows in by_job.items():
        (
            _,
            share,
            memory_mib,
            _,
            attempt,
            state,
            command,
            job_env,
            checkpoint_dir,
            resume,
            shard_index,
            shard_count,
            working_dir,
            grace_seconds,
        ) = rows[0]
        env = {str(k): str(v) for k, v in job_env.items()}
        env["JOB_ID"] = str(job_id)
        if checkpoint_dir:
            env["CHECKPOINT_DIR"] = checkpoint_dir
        env["RESUME"] = "1" if resume else "0"
        if shard_index is not None:
            env["SHARD_INDEX"] = str(shard_index)
            env["SHARD_COUNT"] = str(shard_count or 1)
        preempting = state == JobState.PREEMPTING
        out.append(
            {
                "job_id": job_id,
                "attempt": attempt,
                "action": "stop" if preempting else "run",
                "stop_reason": "preempt" if preempting else None,
                "command": command,
                "env": env,
                "gpu_uuids": [row[3] for row in rows],
                "share_milli": min(share if len(rows) == 1 else 1000, 1000),
                "gpu_memory_limit_mib": memory_mib or None,
                "working_dir": working_dir or None,
                "checkpoint_dir": checkpoint_dir or None,
                "grace_seconds": grace_seconds,
            }
        )
    return out


def _agent_job(node: Node, job_id: int, attempt: int) -> Job:
    """The job, locked, if this node runs that attempt of it; else a 409 for the agent."""
    job = Job.objects.select_for_update().filter(pk=job_id).first()
    if (
        job is None
        or not Allocation.objects.filter(job_id=job_id, node=node, attempt=attempt).exists()
    ):
        raise Conflict("This node does not run that job attempt.", code="stale_attempt")
    if job.attempt != attempt:
        raise Conflict("That attempt of the job is over.", code="stale_attempt")
    return job


@transaction.atomic
def job_started(*, node: Node, job_id: int, attempt: int, pid: int | None) -> Job:
    job = _agent_job(node, job_id, attempt)
    if job.state in (JobState.SCHEDULED, JobState.STARTING):
        job_transition(
            job=job,
            to=JobState.RUNNING,
            reason=f"Started on {node.name}",
            actor_label=f"agent:{node.name}",
            data={"pid": pid, "attempt": attempt},
        )
    return job


# Compiled once: every start an agent reports comes through here. The lock is taken when the
# statement runs, inside `jobs_started`'s transaction.
_LOCK_JOBS = CompiledQuery(
    lambda ids: (
        Job.objects.select_for_update()
        .filter(AnyOf(F("pk"), ids))
        .order_by("pk")
        .values_list("pk", "state", "attempt", "started_at")
    )
)
_HELD_ATTEMPTS = CompiledQuery(
    lambda node_id, ids: Allocation.objects.filter(
        AnyOf(F("job_id"), ids), node_id=node_id
    ).values_list("job_id", "attempt")
)


@transaction.atomic
def jobs_started(*, node: Node, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`job_started` for many attempts at once (an agent's sync): one result per report.

    The same checks as one by one: the node must run that attempt of the job, and the attempt
    must be the job's current one; a stale report is answered as a conflict, not an error.
    """
    ids = sorted({int(r["job_id"]) for r in reports})
    # pk -> [state, attempt, started_at], the rows locked in id order
    jobs = {pk: [state, job_attempt, at] for pk, state, job_attempt, at in _LOCK_JOBS.rows(ids=ids)}
    held = set(_HELD_ATTEMPTS.rows(node_id=node.pk, ids=ids))
    moving: dict[int, list[Any]] = {}
    data: dict[int, dict[str, Any]] = {}
    results: list[dict[str, Any]] = []
    for r in reports:
        job_id, attempt = int(r["job_id"]), int(r["attempt"])
        result: dict[str, Any] = {"kind": "started", "job_id": job_id, "attempt": attempt}
        job = jobs.get(job_id)
        if job is None or (job_id, attempt) not in held:
            result["conflict"] = "This node does not run that job attempt."
        elif job[1] != attempt:
            result["conflict"] = "That attempt of the job is over."
        elif job[0] in (JobState.SCHEDULED, JobState.STARTING) or job_id in moving:
            moving[job_id] = job
            data.setdefault(job_id, {"pid": r.get("pid"), "attempt": attempt})
        results.append(result)
    now = timezone.now()
    jobs_transition_bulk(
        rows=[(pk, job[0], job[2] or now) for pk, job in moving.items()],
        to=JobState.RUNNING,
        reasons={pk: f"Started on {node.name}" for pk in moving},
        actor_label=f"agent:{node.name}",
        data=data,
        update_fields=("started_at",),  # the first start's time; a restart keeps it
        now=now,
    )
    for job in moving.values():
        job[0] = JobState.RUNNING
    for result in results:
        if "conflict" not in result:
            result["state"] = jobs[result["job_id"]][0]
    return results


def agent_reports_apply(*, node: Node, reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Apply an agent's started/exited reports in their order; one result per report.

    Consecutive starts are applied together; each exit on its own. A stale attempt is a
    `conflict` in its result and does not undo the others.
    """
    results: list[dict[str, Any]] = []
    i = 0
    while i < len(reports):
        if reports[i]["kind"] == "started":
            j = i
            while j < len(reports) and reports[j]["kind"] == "started":
                j += 1
            results += jobs_started(node=node, reports=reports[i:j])
            i = j
            continue
        r = reports[i]
        result: dict[str, Any] = {"kind": "exited", "job_id": r["job_id"], "attempt": r["attempt"]}
        try:
            job = job_exited(
                node=node,
                job_id=r["job_id"],
                report=ExitReport(
                    attempt=r["attempt"],
                    exit_code=r["exit_code"],
                    signal=r.get("signal"),
                    reason=r["reason"],
                    message=r.get("message", ""),
                ),
            )
            result["state"] = job.state
        except Conflict as exc:
            result["conflict"] = exc.message
        results.append(result)
        i += 1
    return results


@dataclass(frozen=True)
class ExitReport:
    attempt: int
    exit_code: int | None
    signal: int | None
    reason: str
    message: str = ""


@transaction.atomic
def job_exited(*, node: Node, job_id: int, report: ExitReport) -> Job:
    """Apply an exit the agent reports: success, failure (maybe restart), or the end of a preemption."""
    job = _agent_job(node, job_id, report.attempt)
    label = f"agent:{node.name}"
    data = {"exit_code": report.exit_code, "signal": report.signal, "attempt": report.attempt}
    if job.state not in (
        JobState.SCHEDULED,
        JobState.STARTING,
        JobState.RUNNING,
        JobState.PREEMPTING,
    ):
        # Already handled (a resent report) or cancelled while running: the stop is confirmed.
        return job
    job.exit_code = report.exit_code
    if job.state == JobState.PREEMPTING:
        job.resume = bool(job.checkpoint_dir)
        job.preempt_deadline = None
        how = "resumes from its checkpoint" if job.resume else "restarts from the beginning"
        job_transition(
            job=job,
            to=JobState.QUEUED,
            reason=f"Preempted and requeued; it {how}",
            actor_label=label,
            data=data,
            end_reason=Allocation.EndReason.PREEMPTED,
            update_fields=("exit_code", "resume", "preempt_deadline"),
        )
    elif report.exit_code == 0:
        job_transition(
            job=job,
            to=JobState.SUCCEEDED,
            reason="Exited with code 0",
            actor_label=label,
            data=data,
            update_fields=("exit_code",),
        )
    else:
        what = (
            f"exit code {report.exit_code}"
            if report.exit_code is not None
            else f"signal {report.signal}"
        )
        if report.reason == "failed_to_start":
            what = f"failed to start: {report.message[:200]}"
        if job.restarts < job.max_restarts and job.state == JobState.RUNNING:
            job.restarts += 1
            job.resume = bool(job.checkpoint_dir)
            job_transition(
                job=job,
                to=JobState.QUEUED,
                reason=f"Failed with {what}; restart {job.restarts} of {job.max_restarts}",
                actor_label=label,
                data=data,
                end_reason=Allocation.EndReason.FAILED,
                update_fields=("exit_code", "restarts", "resume"),
            )
        else:
            job.failure_reason = f"Failed with {what}"[:500]
            job_transition(
                job=job,
                to=JobState.FAILED,
                reason=job.failure_reason,
                actor_label=label,
                data=data,
                update_fields=("exit_code", "failure_reason"),
            )
    transaction.on_commit(request_cycle)
    return job


def job_log_append(
    *, node: Node, job_id: int, attempt: int, seq: int, stream: str, text: str
) -> bool:
    """Store a log chunk once; a retried chunk is ignored. Returns whether it was new.

    Chunks of an attempt this node ran are accepted even after the job ended (the last
    lines can race the exit report).
    """
    if not Allocation.objects.filter(job_id=job_id, node=node, attempt=attempt).exists():
        raise Conflict("This node did not run that job attempt.", code="stale_attempt")
    try:
        with transaction.atomic():
            LogChunk.objects.create(
                job_id=job_id, attempt=attempt, seq=seq, stream=stream, text=text
            )
    except IntegrityError:
        return False
    return True


LOSS_STORM_KEY = "scheduler:loss-storm"


def loss_storm() -> dict[str, Any] | None:
    """What the last loss sweep held off for (most nodes silent at once), or None."""
    found = cache.get(LOSS_STORM_KEY)
    return found if isinstance(found, dict) else None


def lost_nodes_sweep(*, now: datetime | None = None) -> list[int]:
    """Nodes silent for longer than NODE_LOST_AFTER_SECONDS become lost; their jobs are requeued
    (or failed when they may not restart). Returns the ids of the nodes marked lost."""
    now = now or timezone.now()
    cutoff = now - timedelta(seconds=settings.NODE_LOST_AFTER_SECONDS)
    watched = Node.objects.filter(
        state__in=[
            Node.State.READY,
            Node.State.CORDONED,
            Node.State.DRAINING,
            Node.State.UNHEALTHY,
        ]
    )
    silent = list(watched.filter(last_heartbeat_at__lt=cutoff).values_list("pk", flat=True))
    total = watched.count() if silent else 0
    if (
        len(silent) >= settings.NODE_LOSS_STORM_MIN_NODES
        and len(silent) > settings.NODE_LOSS_STORM_FRACTION * total
    ):
        # Most of the fleet silent at once: far likelier the portal (overloaded, partitioned)
        # than the nodes. Requeueing everything would make it worse; hold off and say so.
        log.warning(
            "loss sweep held off: %d of %d nodes silent for over %ss at once",
            len(silent),
            total,
            settings.NODE_LOST_AFTER_SECONDS,
        )
        cache.set(
            LOSS_STORM_KEY,
            {"silent": len(silent), "watched": total, "at": now.isoformat()},
            timeout=int(settings.NODE_LOST_AFTER_SECONDS) * 2,
        )
        return []
    cache.delete(LOSS_STORM_KEY)
    lost = []
    for node_id in silent:
        with transaction.atomic():
            node = Node.objects.select_for_update().get(pk=node_id)
            if node.last_heartbeat_at is None or node.last_heartbeat_at >= cutoff:
                continue
            node.state = Node.State.LOST
            node.save(update_fields=["state", "updated_at"])
            NodeEvent.objects.create(
                node=node,
                severity=NodeEvent.Severity.CRITICAL,
                kind="node_lost",
                message=f"No heartbeat since {node.last_heartbeat_at:%Y-%m-%d %H:%M:%S} UTC; "
                "its jobs are requeued",
            )
            audit_record(
                actor=None,
                action="node.lost",
                target=node,
                data={"last_heartbeat": node.last_heartbeat_at.isoformat()},
            )
            job_ids = set(
                Allocation.objects.filter(node=node, ended_at__isnull=True).values_list(
                    "job_id", flat=True
                )
            )
            for job in Job.objects.select_for_update().filter(pk__in=job_ids).order_by("pk"):
                _job_lost(job, node)
            lost.append(node.pk)
    if lost:
        request_cycle()
    return lost


def _job_lost(job: Job, node: Node) -> None:
    _requeue_after_fault(
        job,
        f"Node {node.name} stopped answering",
        end_reason=Allocation.EndReason.NODE_LOST,
        actor="health-sweep",
    )


def _requeue_after_fault(job: Job, why: str, *, end_reason: str, actor: str) -> None:
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


@transaction.atomic
def node_set_state(*, actor: User, node: Node, action: str, remote_addr: str | None = None) -> Node:
    """Operator actions: cordon (no new work), uncordon, drain (no new work; running work ends)."""
    node = Node.objects.select_for_update().get(pk=node.pk)
    allowed = {
        "cordon": ({Node.State.READY}, Node.State.CORDONED),
        "uncordon": ({Node.State.CORDONED, Node.State.DRAINING}, Node.State.READY),
        "drain": ({Node.State.READY, Node.State.CORDONED}, Node.State.DRAINING),
        "reset_health": (
            {Node.State.READY, Node.State.UNHEALTHY, Node.State.CORDONED},
            Node.State.READY,
        ),
        "retire": (
            {Node.State.CORDONED, Node.State.LOST, Node.State.UNHEALTHY},
            Node.State.RETIRED,
        ),
    }
    if action not in allowed:
        raise DomainError(f"Unknown node action '{action}'.", field="action")
    sources, target = allowed[action]
    if node.state not in sources:
        raise Conflict(f"Node {node.name} is {node.state}; it cannot {action}.")
    if action == "retire" and node.allocations.filter(ended_at__isnull=True).exists():
        raise Conflict(f"Node {node.name} still runs work; drain it first.")
    old = node.state
    node.state = target
    node.save(update_fields=["state", "updated_at"])
    if target == Node.State.RETIRED:
        retired_hash = node.agent_token_hash
        transaction.on_commit(lambda: agent_token_forget(retired_hash))
    if action == "reset_health":
        node.gpus.update(health=Gpu.Health.HEALTHY)
    NodeEvent.objects.create(
        node=node,
        kind=f"operator_{action}",
        message=f"{actor.email} ran {action.replace('_', ' ')} ({old} → {target})",
    )
    if action == "drain":
        for job in _jobs_holding(node=node).filter(
            state__in=[JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING]
        ):
            job.preempt_deadline = timezone.now() + timedelta(seconds=job.grace_seconds)
            job_transition(
                job=job,
                to=JobState.PREEMPTING,
                reason=f"Node {node.name} is being drained by an operator; the job will be requeued",
                actor=actor,
                update_fields=("preempt_deadline",),
            )
    audit_record(
        actor=actor,
        action=f"node.{action}",
        target=node,
        data={"from": old, "to": target},
        remote_addr=remote_addr,
    )
    return node


__all__ = [
    "ExitReport",
    "agent_reports_apply",
    "assignments_for",
    "job_exited",
    "job_log_append",
    "job_started",
    "jobs_started",
    "lost_nodes_sweep",
    "node_heartbeat",
    "node_issue_agent_token",
    "node_register",
    "node_set_state",
]
