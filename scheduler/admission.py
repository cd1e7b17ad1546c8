"""Submitting jobs: validate the request, admit it within quotas in one transaction, or reject it.

A request arrives as a `JobSpec` from the form, the JSON API or a Kubernetes manifest.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime
from decimal import Decimal
from typing import Any, NamedTuple, Protocol

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from foundation import push
from foundation.db import insert_instances
from portal.audit import audit_event, audit_record
from portal.errors import DomainError
from portal.models import Project, Role, User
from portal.services import require_role
from scheduler import backends, ports
from scheduler.core.model import MILLI, gpu_demand_milli, gpus_requested
from scheduler.core.periods import month_start
from scheduler.cycle_requests import request_cycle, request_cycle_on_commit
from scheduler.dependencies import (
    Target,
    dependencies_resolve,
    dependencies_text,
    dependency_rows,
    spec_dependencies_validate,
)
from scheduler.dependencies import Verdict as DependenciesVerdict
from scheduler.images import image_check
from scheduler.job_request import MAX_GPUS_PER_JOB, MAX_PATH, MAX_SHARDS, Surface, carried_on
from scheduler.job_volumes import mounts_validate, volumes_resolve
from scheduler.models import (
    ACTIVE_STATES,
    PRECISIONS,
    GpuModel,
    Job,
    JobDependency,
    JobEvent,
    JobState,
    Pool,
    PriorityClass,
    Quota,
)
from scheduler.selectors import gpu_models_job_may_use, project_gpu_hours
from scheduler.transitions import can_transition, job_transition

# What one job stores of its request (command and environment), and an array in all: every
# shard is a row with its own copy, so a small request must not become megabytes of rows.
MAX_JOB_PAYLOAD_BYTES = 64 * 1024
MAX_ARRAY_PAYLOAD_BYTES = 2 * 1024 * 1024
MAX_ENV_VARS = 128
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV = {
    "CUDA_VISIBLE_DEVICES",
    "JOB_ID",
    "CHECKPOINT_DIR",
    "RESUME",
    "SHARD_INDEX",
    "SHARD_COUNT",
}


@dataclass(frozen=True)
class JobSpec:
    """A validated job request, independent of where it came from."""

    name: str
    command: str
    gpus: int = 1
    gpu_milli: int = 1000
    gpu_memory_mib: int = 0
    gpu_model: GpuModel | None = None
    # Any of these catalog models (names), when no single gpu_model is named.
    gpu_models: tuple[str, ...] = ()
    min_gpu_memory_gb: int = 0
    precisions: tuple[str, ...] = ()
    nodes: int | None = None
    gpus_per_node: int | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    shm_mib: int = 0
    priority: int = PriorityClass.NORMAL
    preemptible: bool = False
    runtime_estimate_s: int | None = None
    time_limit_s: int | None = None
    # the project's volumes by name at container paths, and "<volume>:<path>" for checkpoints
    # (scheduler.job_volumes); working_dir is a directory in the container, never a host path
    volumes: tuple[dict[str, Any], ...] = ()
    checkpoint: str = ""
    working_dir: str = ""
    image: str = ""
    env: dict[str, str] = field(default_factory=dict)
    secret_env: dict[str, str] = field(default_factory=dict)  # write-only (see Job.secret_env)
    max_restarts: int = 0
    elastic_min: int | None = None
    elastic_max: int | None = None
    shard_count: int = 1
    # (kind, job id): Slurm's afterok/afterany; a job id that is an array's means all its shards
    dependencies: tuple[tuple[str, int], ...] = ()
    source: str = Job.Source.API
    manifest_ignored: tuple[dict[str, str], ...] = ()
    pool: Pool | None = None  # None: any pool our agents run; a Slurm pool: Slurm runs it

    @property
    def gpu_count(self) -> int:
        return gpus_requested(self.gpus, self.nodes, self.gpus_per_node)

    @property
    def gpu_fraction(self) -> Decimal:
        """GPUs of demand, a fraction counting as that fraction."""
        return (
            Decimal(gpu_demand_milli(self.gpus, self.nodes, self.gpus_per_node, self.gpu_milli))
            / MILLI
        )


def spec_payload_bytes(spec: JobSpec) -> int:
    """Bytes of request text each job row keeps: its command and environment."""
    return len(spec.command.encode()) + sum(
        len(k.encode()) + len(v.encode()) for k, v in [*spec.env.items(), *spec.secret_env.items()]
    )


def _bad(field_name: str, message: str) -> DomainError:
    return DomainError(message, field=field_name)


def _check_name_command(spec: JobSpec) -> None:
    name = spec.name.strip()
    if not name or len(name) > 100:
        raise _bad("name", "Give the job a name of 1 to 100 characters.")
    if not spec.command.strip():
        raise _bad("command", "Enter the command to run, e.g. 'python train.py'.")
    if len(spec.command) > 10_000:
        raise _bad("command", "The command is longer than 10,000 characters; put it in a script.")


def _check_gpu_shape(spec: JobSpec) -> None:
    """Whole GPUs, a fraction of one, or a gang of nodes."""
    if not 1 <= spec.gpus <= MAX_GPUS_PER_JOB:
        raise _bad("gpus", f"Ask for 1 to {MAX_GPUS_PER_JOB} GPUs.")
    if not 1 <= spec.gpu_milli <= 1000:
        raise _bad("gpu_milli", "A GPU share is 1 to 1000 milli-GPU (1000 = a whole GPU).")
    if spec.gpu_milli < 1000 and (spec.gpus != 1 or spec.nodes):
        raise _bad("gpu_milli", "A fraction of a GPU is possible only for a single GPU.")
    if (spec.nodes is None) != (spec.gpus_per_node is None):
        raise _bad("nodes", "A gang job needs both nodes and gpus_per_node.")
    if (
        spec.nodes is not None
        and spec.gpus_per_node is not None
        and (not 1 <= spec.nodes <= 512 or not 1 <= spec.gpus_per_node <= 16)
    ):
        raise _bad("nodes", "A gang is 1 to 512 nodes with 1 to 16 GPUs on each.")
    if spec.gpu_memory_mib and spec.gpu_milli == 1000:
        raise _bad("gpu_memory_mib", "A GPU memory limit applies to a fraction of a GPU only.")


def _check_constraints(spec: JobSpec) -> None:
    unknown = sorted(set(spec.precisions) - set(PRECISIONS))
    if unknown:
        raise _bad(
            "precisions", f"Unknown precision {', '.join(unknown)}; use {', '.join(PRECISIONS)}."
        )
    if not 0 <= spec.min_gpu_memory_gb <= 1000:
        raise _bad("min_gpu_memory_gb", "Minimum GPU memory is 0 to 1000 GB.")


def _check_priority_and_time(spec: JobSpec) -> None:
    if spec.priority not in PriorityClass.values:
        raise _bad(
            "priority", "Priority is one of: " + ", ".join(PriorityClass.names).lower() + "."
        )
    if spec.runtime_estimate_s is not None and not 1 <= spec.runtime_estimate_s <= 90 * 86400:
        raise _bad("runtime_estimate_s", "The runtime estimate is 1 second to 90 days.")
    if spec.time_limit_s is not None and not 60 <= spec.time_limit_s <= 90 * 86400:
        raise _bad("time_limit_s", "The time limit is 1 minute to 90 days.")
    if (
        spec.time_limit_s is not None
        and spec.runtime_estimate_s is not None
        and spec.runtime_estimate_s > spec.time_limit_s
    ):
        raise _bad(
            "runtime_estimate_s",
            "The runtime estimate is longer than the time limit; the job would be stopped first.",
        )
    if not 0 <= spec.max_restarts <= 10:
        raise _bad("max_restarts", "Allow 0 to 10 restarts.")


def _check_array_and_dependencies(spec: JobSpec) -> None:
    if not 1 <= spec.shard_count <= MAX_SHARDS:
        raise _bad("shard_count", f"An array job has 1 to {MAX_SHARDS} shards.")
    spec_dependencies_validate(spec.dependencies)


def _check_payload(spec: JobSpec) -> None:
    """What each job row keeps of the request, and an array in all."""
    if len(spec.env) + len(spec.secret_env) > MAX_ENV_VARS:
        raise _bad("env", f"At most {MAX_ENV_VARS} environment variables.")
    payload = spec_payload_bytes(spec)
    if payload > MAX_JOB_PAYLOAD_BYTES:
        raise _bad(
            "env",
            f"The command and environment take {payload:,} bytes; the most is "
            f"{MAX_JOB_PAYLOAD_BYTES:,}. Put large inputs in files.",
        )
    if payload * spec.shard_count > MAX_ARRAY_PAYLOAD_BYTES:
        raise _bad(
            "shard_count",
            f"{spec.shard_count} shards × {payload:,} bytes of command and environment is more "
            f"than {MAX_ARRAY_PAYLOAD_BYTES:,} bytes; use fewer shards or a shorter command "
            "(read per-shard inputs by SHARD_INDEX).",
        )


def _check_elastic_and_size(spec: JobSpec) -> None:
    if spec.elastic_min is not None or spec.elastic_max is not None:
        lo, hi = spec.elastic_min or spec.gpus, spec.elastic_max or spec.gpus
        if (
            spec.nodes
            or spec.gpu_milli < 1000
            or not 1 <= lo <= spec.gpus <= hi <= MAX_GPUS_PER_JOB
        ):
            raise _bad(
                "elastic_min",
                "An elastic job asks for whole GPUs with elastic_min ≤ gpus ≤ elastic_max.",
            )
    if spec.cpu_milli > 4_096_000 or spec.memory_mib > 64 * 1024 * 1024:
        raise _bad("cpu_milli", "CPU and memory requests are beyond any node.")


def _check_env(spec: JobSpec) -> None:
    for label, env in (("env", spec.env), ("secret_env", spec.secret_env)):
        for key, value in env.items():
            if not ENV_NAME.match(str(key)):
                raise _bad(label, f"'{key}' is not a valid environment variable name.")
            if key in RESERVED_ENV:
                raise _bad(label, f"{key} is set by the platform; remove it.")
            if not isinstance(value, str) or len(value) > 4096:
                raise _bad(
                    label, f"The value of {key} must be a string of at most 4096 characters."
                )
    both = sorted(set(spec.env) & set(spec.secret_env))
    if both:
        raise _bad("secret_env", f"{', '.join(both)} is both plain and secret; keep one.")
    if len(spec.env) > 100:
        raise _bad("env", "At most 100 environment variables.")


def _check_paths_image_shm(spec: JobSpec) -> None:
    if len(spec.working_dir) > MAX_PATH:
        raise _bad("working_dir", f"The working directory is at most {MAX_PATH} characters.")
    image_check(spec.image)
    if spec.shm_mib and not 0 < spec.shm_mib <= 1024 * 1024:
        raise _bad("shm_mib", "Shared memory is at most 1 TiB.")


def _check_gpu_models(spec: JobSpec) -> None:
    """A list of catalog models: all known, at least one meeting the memory and precisions."""
    if not spec.gpu_models:
        return
    if spec.gpu_model is not None:
        raise _bad("gpu_models", "Name one GPU model or a list of models, not both.")
    active = {
        m.name: m for m in GpuModel.objects.filter(is_active=True, name__in=list(spec.gpu_models))
    }
    unknown_models = [name for name in spec.gpu_models if name not in active]
    if unknown_models:
        raise _bad("gpu_models", f"Unknown GPU model {', '.join(unknown_models)}.")
    if not gpu_models_job_may_use(spec):
        raise _bad(
            "gpu_models",
            "None of " + ", ".join(spec.gpu_models) + " meets the memory and precision asked.",
        )


def _check_gpu_model(spec: JobSpec) -> None:
    """The model named meets the constraints; with no model, some catalog model does."""
    model = spec.gpu_model
    if model is not None:
        if spec.min_gpu_memory_gb > model.memory_gb:
            raise _bad(
                "min_gpu_memory_gb",
                f"{model.name} has {model.memory_gb} GB; you asked for at least "
                f"{spec.min_gpu_memory_gb} GB.",
            )
        missing = sorted(set(spec.precisions) - set(model.precisions))
        if missing:
            raise _bad("precisions", f"{model.name} does not support {', '.join(missing)}.")
        if spec.gpu_memory_mib > model.memory_mib:
            raise _bad("gpu_memory_mib", f"{model.name} has only {model.memory_mib} MiB.")
    elif not spec.gpu_models and not gpu_models_job_may_use(spec):
        raise _bad(
            "precisions",
            "No GPU model in the catalog meets these constraints; relax memory or precision.",
        )


# The checks in the order they run: the first that fails names its field.
SPEC_CHECKS: tuple[Callable[[JobSpec], None], ...] = (
    _check_name_command,
    _check_gpu_shape,
    _check_constraints,
    _check_priority_and_time,
    _check_array_and_dependencies,
    _check_payload,
    _check_elastic_and_size,
    _check_env,
    _check_paths_image_shm,
    _check_gpu_models,
    _check_gpu_model,
)


def spec_validate(spec: JobSpec) -> JobSpec:
    """Check a spec for consistency; raise DomainError naming the field and what to fix."""
    for check in SPEC_CHECKS:
        check(spec)
    # the volumes, checkpoint and working directory: container paths only, normalised
    volumes, checkpoint, working_dir = mounts_validate(
        spec.volumes, spec.checkpoint, spec.working_dir
    )
    return replace(
        spec,
        name=spec.name.strip(),
        volumes=volumes,
        checkpoint=checkpoint,
        working_dir=working_dir,
    )


@dataclass(frozen=True)
class Verdict:
    """What admission decided: admit (maybe as borrowed preemptible work) or reject, and why."""

    admit: bool
    borrowed: bool = False
    reason: str = ""
    quota_notes: tuple[str, ...] = ()


class AdmissionCheck(Protocol):
    """A port: says why a submission must be refused (billing's budget), or None."""

    def __call__(self, *, project: Project, spec: JobSpec, now: datetime) -> Verdict | None: ...


ADMISSION_CHECKS: ports.Hub[AdmissionCheck] = ports.Hub("admission checks")


def admission_hook_verdicts(*, project: Project, spec: JobSpec, now: datetime) -> list[Verdict]:
    """What the admission extension points (billing's budget) say; they never read the quota."""
    verdicts: list[Verdict | None] = [
        check(project=project, spec=spec, now=now) for check in ADMISSION_CHECKS
    ]
    return [v for v in verdicts if v is not None]


@dataclass
class _Admission:
    """What the admission rules look at, and what they add up: notes and borrowing."""

    project: Project
    quota: Quota
    spec: JobSpec
    now: datetime
    model_limits: dict[int, int] | None
    member_gpus: Decimal | None
    notes: list[str] = field(default_factory=list)
    borrowed: bool = False

    def limits(self) -> dict[int, int]:
        """GPU model id -> max GPUs (the quota's, read once, unless the caller read them)."""
        if self.model_limits is None:
            self.model_limits = {
                lim.gpu_model_id: lim.max_gpus for lim in self.quota.model_limits.all()
            }
        return self.model_limits

    def over(self, reason: str) -> Verdict | None:
        """Over a borrowable limit: rejected, or admitted as borrowed preemptible work."""
        if not self.quota.allow_borrowing:
            return Verdict(False, reason=reason)
        self.borrowed = True
        return None


AdmissionRule = Callable[[_Admission], Verdict | None]


def _member_cap(a: _Admission) -> Verdict | None:
    cap = a.quota.max_gpus_per_member
    if cap is None or a.member_gpus is None:
        return None
    a.notes.append(f"per member: {cap} GPUs at once")
    asked = a.spec.gpu_fraction * a.spec.shard_count  # every shard of an array job
    if a.member_gpus + asked > cap:
        return Verdict(
            False,
            reason=f"Your queued and running jobs ask for {a.member_gpus} GPUs; with this "
            f"job's {asked} that is over the {cap} GPUs a member of "
            f"{a.project.name} may ask for at once (set by its owners).",
        )
    return None


def _job_size(a: _Admission) -> Verdict | None:
    if a.spec.gpu_count > a.quota.max_gpus_per_job:
        return Verdict(
            False,
            reason=f"The job asks for {a.spec.gpu_count} GPUs; {a.project.name} allows at most "
            f"{a.quota.max_gpus_per_job} per job.",
        )
    return None


def _priority_ceiling(a: _Admission) -> Verdict | None:
    if a.spec.priority > a.quota.max_priority:
        return Verdict(
            False,
            reason=f"Priority {PriorityClass(a.spec.priority).label} is above your project's "
            f"ceiling ({PriorityClass(a.quota.max_priority).label}).",
        )
    return None


def _concurrent_gpus(a: _Admission) -> Verdict | None:
    if a.quota.max_gpus is None:
        return None
    a.notes.append(f"concurrent GPUs: {a.quota.max_gpus} for the project")
    if a.spec.gpu_fraction > a.quota.max_gpus:
        return a.over(
            f"The job needs {a.spec.gpu_fraction} GPUs at once; the project's quota "
            f"is {a.quota.max_gpus}."
        )
    return None


def _model_limit(a: _Admission) -> Verdict | None:
    model = a.spec.gpu_model
    if model is None:
        return None
    limit = a.limits().get(model.pk)
    if limit is None:
        return None
    a.notes.append(f"{model.name}: {limit} GPUs for the project")
    if a.spec.gpu_fraction > limit:
        return a.over(
            f"The job needs {a.spec.gpu_fraction} × {model.name}; the project may hold {limit}."
        )
    return None


def _models_limit(a: _Admission) -> Verdict | None:
    """The job may land on any of its models: it is held back only if every one of them is
    limited below its demand."""
    names = a.spec.gpu_models
    if not names:
        return None
    model_limits = a.limits()
    ids = dict(GpuModel.objects.filter(name__in=names).values_list("name", "pk"))
    limits = [model_limits.get(ids.get(name, -1)) for name in names]
    if not limits or any(lim is None for lim in limits):
        return None
    most = max(lim for lim in limits if lim is not None)
    a.notes.append(f"{' or '.join(names)}: at most {most} GPUs for the project")
    if a.spec.gpu_fraction > most:
        return a.over(
            f"The job needs {a.spec.gpu_fraction} GPUs of {' or '.join(names)}; the project "
            f"may hold {most}."
        )
    return None


def _monthly_hours(a: _Admission) -> Verdict | None:
    hours = a.quota.gpu_hours_per_month
    if hours is None:
        return None
    used = project_gpu_hours(a.project, since=month_start(a.now), now=a.now)
    a.notes.append(f"GPU-hours this month: {used} of {hours}")
    if used >= hours:
        return a.over(f"{a.project.name} has used its {hours} GPU-hours for this month.")
    return None


# The quota rules in the order they decide: the first rejection is the answer.
ADMISSION_RULES: tuple[AdmissionRule, ...] = (
    _member_cap,
    _job_size,
    _priority_ceiling,
    _concurrent_gpus,
    _model_limit,
    _models_limit,
    _monthly_hours,
)


def admission_verdict(
    *,
    project: Project,
    quota: Quota,
    spec: JobSpec,
    now: datetime,
    hook_verdicts: list[Verdict] | None = None,
    model_limits: dict[int, int] | None = None,
    member_gpus: Decimal | None = None,
) -> Verdict:
    """Quota rules that decide at submission. Concurrency is held per cycle by the scheduler.

    Every rule (`ADMISSION_RULES`) looks at this job, the quota and the project's allocations,
    never at other admissions: concurrent submissions cannot change each other's verdicts.
    `hook_verdicts`: the extension points' answers if the caller asked them already (before
    taking the quota lock); they weigh after the quota rules either way.
    `model_limits`: GPU model id -> max GPUs if the caller read them already, else the quota's.
    `member_gpus`: the GPUs the submitting member's queued and active jobs ask for, when the
    owners set a per-member cap (`Quota.max_gpus_per_member`); not borrowable.
    """
    a = _Admission(project, quota, spec, now, model_limits, member_gpus)
    for rule in ADMISSION_RULES:
        verdict = rule(a)
        if verdict is not None:
            return verdict
    if hook_verdicts is None:
        hook_verdicts = admission_hook_verdicts(project=project, spec=spec, now=now)
    for hook in hook_verdicts:
        if not hook.admit:
            return hook
        a.borrowed = a.borrowed or hook.borrowed
        a.notes.extend(hook.quota_notes)
    reason = (
        "Over quota: admitted as preemptible work on idle GPUs." if a.borrowed else "Within quota."
    )
    return Verdict(True, borrowed=a.borrowed, reason=reason, quota_notes=tuple(a.notes))


# The queued jobs' count is an exact COUNT on the (project, state) index (a counter row would
# serialise a project's concurrent submits), read in the same statement: one round trip less.
# Fast path (raw SQL), on every submission (`bench.submit_cost`).
QUOTA_SHARE_LOCKED = """
SELECT q.id, q.max_gpus, q.gpu_hours_per_month, q.max_gpus_per_job, q.max_priority,
       q.allow_borrowing, q.updated_at, q.max_gpus_per_member,
       (SELECT json_agg(json_build_array(l.gpu_model_id, l.max_gpus))
          FROM portal_quotamodellimit l WHERE l.quota_id = q.id),
       (SELECT count(*) FROM scheduler_job j WHERE j.project_id = q.project_id AND j.state = %s)
  FROM portal_quota q WHERE q.project_id = %s
   FOR SHARE OF q
"""


class QuotaForAdmission(NamedTuple):
    quota: Quota
    model_limits: dict[int, int]  # GPU model id -> max GPUs
    queued: int  # the project's jobs waiting in the queue (what the queued-jobs cap counts)


def quota_lock_for_admission(project: Project) -> QuotaForAdmission:
    """The project's quota, its per-model limits and its queued jobs' count, in one
    statement, the quota's row locked to commit.

    A shared lock: admissions do not wait for each other (no rule reads another admission),
    but a quota edit (an UPDATE) waits for the admissions in flight, and they for it, so every
    verdict is made against the quota as it stands when the job is committed.
    """
    if connection.vendor != "postgresql":  # SQLite locks the whole database on write anyway
        quota = (
            Quota.objects.select_for_update().prefetch_related("model_limits").get(project=project)
        )
        return QuotaForAdmission(
            quota,
            {lim.gpu_model_id: lim.max_gpus for lim in quota.model_limits.all()},
            Job.objects.filter(project=project, state=JobState.QUEUED).count(),
        )
    with connection.cursor() as cursor:
        cursor.execute(QUOTA_SHARE_LOCKED, [str(JobState.QUEUED), project.pk])
        row = cursor.fetchone()
    if row is None:
        raise Quota.DoesNotExist(f"{project} has no quota.")
    (
        pk,
        max_gpus,
        hours,
        per_job,
        max_priority,
        borrowing,
        updated_at,
        per_member,
        limits,
        queued,
    ) = row
    quota = Quota(
        pk=pk,
        project=project,
        max_gpus=max_gpus,
        gpu_hours_per_month=hours,
        max_gpus_per_job=per_job,
        max_priority=max_priority,
        allow_borrowing=borrowing,
        updated_at=updated_at,
        max_gpus_per_member=per_member,
    )
    if isinstance(limits, str):  # json, not jsonb: some drivers hand back the text
        limits = json.loads(limits)
    return QuotaForAdmission(
        quota, {int(model_id): int(cap) for model_id, cap in limits or ()}, int(queued)
    )


def member_gpus_asked(*, project: Project, user: User) -> Decimal:
    """GPUs (a fraction as that fraction) the user's queued and active jobs in the project ask
    for: what a per-member cap counts. Read only when the owners set one."""
    rows = Job.objects.filter(
        project=project, submitted_by=user, state__in=[JobState.QUEUED, *ACTIVE_STATES]
    ).values_list("gpus", "gpu_milli", "nodes", "gpus_per_node")
    milli = sum(gpu_demand_milli(g, n, per_node, m) for g, m, n, per_node in rows)
    return Decimal(milli) / MILLI


# The Job row's columns for the spec's fields, from the declaration (`scheduler.job_request`).
MODEL_COLUMNS: tuple[tuple[str, str], ...] = tuple(
    (f.name, str(f.model)) for f in carried_on(Surface.MODEL)
)


def job_from_spec(
    spec: JobSpec, *, project: Project, user: User | None = None, shard: int | None = None
) -> Job:
    """An unsaved Job for a spec (one shard of it, for array jobs)."""
    columns = {
        column: list(value) if isinstance(value := getattr(spec, name), tuple) else value
        for name, column in MODEL_COLUMNS
    }
    name = spec.name if shard is None else f"{spec.name}[{shard}]"
    columns |= {
        "name": name[:100],
        "shard_index": shard,
        "shard_count": spec.shard_count if shard is not None else None,
    }
    job = Job(
        **columns,
        project=project,
        source=spec.source,
        manifest_ignored=list(spec.manifest_ignored),
    )
    if user is not None:
        job.submitted_by = user
    return job


class QueueFull(DomainError):
    status = 429


def queued_cap_check(*, project: Project, waiting: int, adding: int) -> None:
    """A project may have at most PROJECT_MAX_QUEUED_JOBS jobs waiting: past it, a submit is
    refused (429) before anything is written, so no tenant can flood the queue. `waiting`:
    the project's queued jobs (`quota_lock_for_admission` counts them)."""
    cap: int = settings.PROJECT_MAX_QUEUED_JOBS
    if waiting + adding > cap:
        raise QueueFull(
            f"Project {project.slug} has {waiting:,} jobs waiting; the cap is {cap:,}. "
            "Wait for some to start, or cancel some.",
            code="queue_full",
        )


def _admit_locked(
    *, actor: User, project: Project, spec: JobSpec, now: datetime, hooks: list[Verdict]
) -> Verdict:
    """The verdict against the quota as it stands at commit: its row is locked (shared) to the
    end of the transaction; the queued-jobs cap refuses before anything is written."""
    quota, model_limits, queued = quota_lock_for_admission(project)
    queued_cap_check(project=project, waiting=queued, adding=spec.shard_count)
    member_gpus = (
        member_gpus_asked(project=project, user=actor)
        if quota.max_gpus_per_member is not None
        else None
    )
    return admission_verdict(
        project=project,
        quota=quota,
        spec=spec,
        now=now,
        hook_verdicts=hooks,
        model_limits=model_limits,
        member_gpus=member_gpus,
    )


def _jobs_in_verdict_state(
    jobs: list[Job], verdict: Verdict, *, waiting: DependenciesVerdict, now: datetime
) -> JobState:
    """Every job in its verdict's state (queued, waiting on dependencies, or rejected)."""
    to = JobState.QUEUED if verdict.admit else JobState.REJECTED
    if not can_transition(JobState.PENDING, to):  # the table is the authority, even here
        raise DomainError(f"A submitted job cannot become {to}.", code="invalid_transition")
    for job in jobs:
        job.borrowed = verdict.borrowed
        job.state = to
        if verdict.admit:
            job.queued_at = now
            if not waiting.met:  # planned only once what it depends on is done
                job.waiting_on_dependencies = True
                job.pending_reason = "dependency"
                job.pending_message = waiting.waiting[:500]
        else:
            job.failure_reason = verdict.reason[:500]
            job.finished_at = now
    return to


def _jobs_insert(jobs: list[Job], targets: list[Target] | None) -> None:
    """The jobs (an array's shards point at the first), their dependencies if any."""
    insert_instances(jobs[:1])
    if len(jobs) > 1:
        for job in jobs[1:]:
            job.array_parent = jobs[0]
        Job.objects.bulk_create(jobs[1:])
    if targets:
        JobDependency.objects.bulk_create(dependency_rows(jobs, targets))


def _submit_events(
    jobs: list[Job], *, actor: User, verdict: Verdict, to: JobState
) -> list[JobEvent]:
    """Each job's two events: submitted as pending, then queued or rejected."""
    if verdict.admit:
        reason = f"Submitted by {actor.email}. {verdict.reason}"
        data = {"quota": list(verdict.quota_notes), "borrowed": verdict.borrowed}
    else:
        reason, data = f"Rejected at admission: {verdict.reason}", {}
    events = []
    for job in jobs:
        events.append(
            JobEvent(
                job=job,
                to_state=JobState.PENDING,
                actor=actor,
                actor_label=actor.email,
                reason="Submitted",
            )
        )
        events.append(
            JobEvent(
                job=job,
                from_state=JobState.PENDING,
                to_state=to,
                actor=actor,
                actor_label=str(actor),
                reason=reason[:500],
                data=data,
            )
        )
    return events


@transaction.atomic
def job_submit(
    *, actor: User, project: Project, spec: JobSpec, remote_addr: str | None = None
) -> list[Job]:
    """Validate, admit or reject, and queue the job (one per shard). Returns the jobs.

    Every job is written in its verdict's state with both of its events (submitted as pending,
    then queued or rejected), checked against the transition table: a job is pending only
    inside this transaction, so nothing else can see it or move it in between. Everything that
    does not depend on the quota (role, validation, billing's checks, the unsaved rows) comes
    before the quota row is locked; from the lock to the commit there are one read (the quota,
    its limits and the queued jobs' count for the cap, which refuses before any write) and the
    writes.
    """
    require_role(user=actor, project=project, roles=(Role.OWNER, Role.MEMBER))
    spec = spec_validate(spec)
    volumes_resolve(project=project, volumes=spec.volumes)
    targets, waiting = dependencies_resolve(user=actor, deps=spec.dependencies)
    now = timezone.now()
    # Billing's checks do not read the quota: asked before the lock, they do not lengthen it.
    hooks = admission_hook_verdicts(project=project, spec=spec, now=now)
    shards = [None] if spec.shard_count == 1 else list(range(spec.shard_count))
    jobs = [job_from_spec(spec, project=project, user=actor, shard=shard) for shard in shards]
    verdict = _admit_locked(actor=actor, project=project, spec=spec, now=now, hooks=hooks)
    to = _jobs_in_verdict_state(jobs, verdict, waiting=waiting, now=now)
    _jobs_insert(jobs, targets if verdict.admit else None)
    audit = audit_event(
        actor=actor,
        action="job.submit" if verdict.admit else "job.reject",
        target=jobs[0],
        project=project,
        data={
            "jobs": [j.pk for j in jobs],
            "gpus": spec.gpu_count,
            "reason": verdict.reason,
            **({"dependencies": dependencies_text(spec.dependencies)} if targets else {}),
        },
        remote_addr=remote_addr,
    )
    # one statement for both
    insert_instances(_submit_events(jobs, actor=actor, verdict=verdict, to=to), [audit])
    push.jobs_changed((job.pk, project.pk) for job in jobs)  # the queue has new jobs
    if verdict.admit:
        request_cycle_on_commit()  # with the push message: one round trip
    return jobs


@transaction.atomic
def job_cancel(*, actor: User, job: Job, remote_addr: str | None = None) -> Job:
    """Cancel a job. Its GPUs are free at once; its node's agent stops the process."""
    require_role(user=actor, project=job.project, roles=(Role.OWNER, Role.MEMBER))
    job = Job.objects.select_for_update().get(pk=job.pk)
    if job.is_terminal:
        raise DomainError(f"Job {job.pk} already ended ({job.state}).", code="already_ended")
    job_transition(
        job=job, to=JobState.CANCELLED, reason=f"Cancelled by {actor.email}", actor=actor
    )
    audit_record(
        actor=actor, action="job.cancel", target=job, project=job.project, remote_addr=remote_addr
    )
    if backends.is_external(job):
        transaction.on_commit(lambda: backends.cancel(job))  # scancel, after our state is saved
    transaction.on_commit(request_cycle)
    return job
