"""Our jobs → Slurm batch jobs: the sbatch command line, the cycle's hand-off, cancel, dry run."""

from __future__ import annotations

import math
import re
import shlex
from collections import defaultdict
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from scheduler.backends.slurm.client import SlurmError, cluster_for
from scheduler.backends.slurm.models import SlurmJob, SlurmPool
from scheduler.dependencies import judge, states_of, targets_of
from scheduler.job_volumes import checkpoint_split
from scheduler.models import DependencyKind, Job, JobEvent, JobState, Pool
from scheduler.transitions import job_transition

ACTOR = "slurm"


@dataclass(frozen=True)
class BatchJob:
    """An sbatch invocation: its options and its script."""

    args: tuple[str, ...]
    script: str
    output_pattern: str  # with %a for an array's task index

    def command_line(self) -> str:
        return shlex.join(["sbatch", *self.args])


def gres_type(cfg: SlurmPool, job: Job) -> str | None:
    """The GRES type for the job's GPU model, or None for any GPU. Raises for an unmapped model."""
    if job.gpu_model_id is None:
        return None
    name = job.gpu_model.name if job.gpu_model is not None else ""
    kind = cfg.gpu_types.get(name)
    if not kind:
        raise SlurmError(f"the Slurm pool {cfg.pool.name} has no GPU type for {name}")
    return str(kind)


def qos_for(cfg: SlurmPool, job: Job) -> str:
    if job.preemptible or job.borrowed:
        return cfg.preemptible_qos
    return str(cfg.qos_by_priority.get(str(job.priority), "normal"))


def volume_script(
    cfg: SlurmPool, job: Job, volume_ids: Mapping[str, int] | None = None
) -> list[str]:
    """The script's lines that give a job its volumes on the cluster: VOLUME_<NAME> (a shared
    volume is <storage_root>/v<id>, scratch a directory of its own removed at the end),
    CHECKPOINT_DIR inside its volume, and the working directory when it is in a volume. A
    Slurm job runs no container: it sees host paths of the cluster's filesystem, not the
    container paths (docs/slurm.md). `volume_ids`: name → id (read here when not given)."""
    mounts = list(job.volumes or [])
    if not mounts:
        return []
    shared = [m["name"] for m in mounts if m.get("kind") != "scratch"]
    if shared and not cfg.storage_root:
        raise SlurmError(
            f"the Slurm pool {cfg.pool.name} has no storage root: its jobs cannot mount volumes"
        )
    if volume_ids is None:
        volume_ids = _volume_ids(job, shared)
    root = cfg.storage_root.rstrip("/")
    lines: list[str] = []
    host: dict[str, str] = {}
    for m in mounts:
        name = m["name"]
        var = "VOLUME_" + name.upper().replace("-", "_")
        if m.get("kind") == "scratch":
            lines += [
                f'export {var}="${{TMPDIR:-/tmp}}/portal-job-$SLURM_JOB_ID-{name}"',
                f'mkdir -p -m 0700 "${var}"',
                f"trap 'rm -rf \"${var}\"' EXIT",
            ]
        elif name not in volume_ids:
            raise SlurmError(f"volume {name} is not a shared volume of {job.project.slug}")
        else:
            lines.append(f"export {var}={shlex.quote(f'{root}/v{volume_ids[name]}')}")
        host[m["path"]] = f"${var}"
    place = checkpoint_split(job.checkpoint)
    if place is not None:
        base = "${VOLUME_" + place[0].upper().replace("-", "_") + "}"
        rel = f"/{shlex.quote(place[1])}" if place[1] else ""
        lines += [f'export CHECKPOINT_DIR="{base}"{rel}', 'mkdir -p "$CHECKPOINT_DIR"']
    for path, var in sorted(host.items(), key=lambda kv: -len(kv[0])):
        if job.working_dir and (job.working_dir == path or job.working_dir.startswith(path + "/")):
            rest = job.working_dir[len(path) :]
            lines.append(f'cd "{var}"{shlex.quote(rest) if rest else ""}')
            break
    return lines


def _volume_ids(job: Job, names: list[str]) -> dict[str, int]:
    """The job's project's live shared volumes by name (node-local ones are the portal's nodes'
    own: refused)."""
    from storage.models import Volume, VolumeKind, VolumeState

    rows = Volume.objects.filter(
        project_id=job.project_id, name__in=names, state=VolumeState.ACTIVE
    ).values_list("name", "pk", "kind")
    local = [name for name, _, kind in rows if kind != VolumeKind.SHARED]
    if local:
        raise SlurmError(
            f"volume {local[0]} is node-local (on one of the portal's nodes): a Slurm pool "
            "mounts shared volumes only"
        )
    return {name: pk for name, pk, _ in rows}


def batch_job(
    cfg: SlurmPool,
    job: Job,
    *,
    shards: int = 1,
    dependency: str | None = None,
    volume_ids: Mapping[str, int] | None = None,
) -> BatchJob:
    """The sbatch options for `job` (the first shard of an array of `shards`); `dependency`:
    Slurm's --dependency value (`scheduler.dependencies.slurm_dependency`)."""
    if job.gpu_milli != 1000:
        raise SlurmError("Slurm pools take whole GPUs (a GPU share cannot be asked of Slurm)")
    kind = gres_type(cfg, job)
    gpus_per_node = job.gpus_per_node if job.nodes and job.gpus_per_node else job.gpus
    nodes = job.nodes if job.nodes and job.gpus_per_node else 1
    gres = f"gpu:{kind}:{gpus_per_node}" if kind else f"gpu:{gpus_per_node}"
    total = nodes * gpus_per_node
    args = [
        f"--job-name={job.name[:64] if shards == 1 else job.name.split('[')[0][:64]}",
        f"--partition={','.join(cfg.partition_list)}",
        f"--account={job.project.slug}",
        f"--qos={qos_for(cfg, job)}",
        f"--nodes={nodes}",
        f"--gres={gres}",
        f"--comment=portal-job-{job.pk}",
        "--open-mode=append",
        "--requeue" if job.preemptible or job.borrowed or job.max_restarts else "--no-requeue",
    ]
    if job.cpu_milli:
        args.append(f"--cpus-per-gpu={max(1, math.ceil(job.cpu_milli / 1000 / total))}")
    if job.memory_mib:
        args.append(f"--mem-per-gpu={max(1, math.ceil(job.memory_mib / total))}M")
    if job.time_limit_s:
        minutes, seconds = divmod(job.time_limit_s, 60)
        args.append(f"--time={minutes}:{seconds:02d}")
    if dependency:
        args.append(f"--dependency={dependency}")
    out_dir = cfg.output_dir.rstrip("/")
    if shards > 1:
        args.append(f"--array=0-{shards - 1}")
        pattern = f"{out_dir}/portal-job-{job.pk}-%a.out"
    else:
        pattern = f"{out_dir}/portal-job-{job.pk}.out"
    args += [f"--output={pattern}", f"--chdir={out_dir}"]
    lines = ["#!/bin/bash", f"# portal job {job.pk} of project {job.project.slug}"]
    env = {**job.env, **job.secret_env, "JOB_ID": str(job.pk)}
    if shards > 1:
        env["SHARD_COUNT"] = str(shards)
        lines.append('export SHARD_INDEX="$SLURM_ARRAY_TASK_ID"')
    lines += [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items())]
    lines += volume_script(cfg, job, volume_ids)
    lines.append(job.command)
    return BatchJob(tuple(args), "\n".join(lines) + "\n", pattern)


def _groups(jobs: list[Job]) -> list[list[Job]]:
    """One sbatch per job, one per array (its shards in index order)."""
    by_root: dict[int, list[Job]] = defaultdict(list)
    for job in jobs:
        by_root[job.array_parent_id or job.pk].append(job)
    return [sorted(g, key=lambda j: j.shard_index or 0) for g in by_root.values()]


def slurm_dependency(job: Job, slurm_ids: dict[int, str]) -> str | None:
    """Slurm's ``--dependency`` value for a job of a Slurm pool, or None while it cannot be
    handed over yet (a job it waits on is not in Slurm, or runs elsewhere and is not done).

    `slurm_ids`: the Slurm id of each of our jobs already in the same cluster. Dependencies met
    already are left out; an array is named by its Slurm array job id (all its tasks)."""
    targets = targets_of([job.pk]).get(job.pk, [])
    covered = states_of(targets)
    parts: list[str] = []
    for t in targets:
        if judge(t, covered.get(t.on, [])).met:
            continue
        sid = slurm_ids.get(t.on)
        if sid is None:
            return None
        if t.whole_array:
            sid = sid.split("_", 1)[0]
        slurm_kind = "afterok" if t.kind == DependencyKind.AFTER_OK else "afterany"
        parts.append(f"{slurm_kind}:{sid}")
    return ",".join(parts)


def _slurm_ids(job: Job, cfg: SlurmPool) -> dict[int, str]:
    """The Slurm ids, in this pool, of the jobs `job` depends on."""
    return dict(
        SlurmJob.objects.filter(
            pool_id=cfg.pool_id, job_id__in=job.dependencies.values("on_id")
        ).values_list("job_id", "slurm_job_id")
    )


_Ready = tuple[list[Job], SlurmPool, BatchJob]  # a group of our jobs and its batch job
_Refused = tuple[list[Job], str]  # a group Slurm (or its account) refused, and why


def submit_queued(*, limit: int = 500, parallel: int = 8) -> int:
    """The cycle's hand-off: every queued job of a Slurm pool that Slurm has not got yet becomes
    a batch job (an array's shards one array job). Returns how many of our jobs went.

    The jobs stay locked (skip-locked: a second hand-off takes others) while their sbatch calls
    run, several at once: an sbatch is a process and a round trip to slurmctld, and one after
    the other they would cap the hand-off at a few jobs per second on a busy host."""
    with transaction.atomic():
        jobs = list(
            Job.objects.select_for_update(skip_locked=True, of=("self",))
            .filter(state=JobState.QUEUED, pool__backend=Pool.Backend.SLURM, slurm__isnull=True)
            .select_related("pool__slurm", "project", "gpu_model")
            .order_by("pk")[:limit]
        )
        ready, refused = _batch_jobs(jobs)
        answers = _sbatch_all(ready, parallel=parallel)
        touched = _record_submitted(ready, answers, refused)
        _fail_refused(refused)
    return len(touched)


def _batch_jobs(jobs: list[Job]) -> tuple[list[_Ready], list[_Refused]]:
    """Each group that can go now with its batch job; those refused (their Slurm account)."""
    from scheduler.backends.slurm.accounts import ensure_account

    ready: list[_Ready] = []
    refused: list[_Refused] = []
    for group in _groups(jobs):
        first = group[0]
        cfg = first.pool.slurm  # type: ignore[union-attr]
        shards = first.shard_count or 1
        if shards > 1 and len(group) != shards:
            continue  # part of the array is not here (locked elsewhere): next pass
        dependency = None
        if first.waiting_on_dependencies:
            dependency = slurm_dependency(first, _slurm_ids(first, cfg))
            if dependency is None:
                continue  # it waits on work Slurm has not got: the portal holds it
        try:
            ensure_account(cfg, first.project)
            ready.append((group, cfg, batch_job(cfg, first, shards=shards, dependency=dependency)))
        except SlurmError as exc:
            refused.append((group, str(exc)))
    return ready, refused


def _sbatch(item: _Ready) -> str | SlurmError:
    _group, cfg, batch = item
    try:
        return cluster_for(cfg.pool).sbatch(batch.args, batch.script)
    except SlurmError as exc:
        return exc


def _sbatch_all(ready: list[_Ready], *, parallel: int) -> list[str | SlurmError]:
    """Each batch job's sbatch answer (its Slurm id, or the error), several at once."""
    if len(ready) > 1:
        with ThreadPoolExecutor(max_workers=min(parallel, len(ready))) as pool:
            return list(pool.map(_sbatch, ready))
    return [_sbatch(item) for item in ready]


def _record_submitted(
    ready: list[_Ready], answers: list[str | SlurmError], refused: list[_Refused]
) -> list[Job]:
    """Link each submitted job to its Slurm id, with an event and its waiting reason; a group
    sbatch refused joins `refused`. Returns the jobs submitted."""
    now = timezone.now()
    links, events, touched = [], [], []
    for (group, cfg, batch), answer in zip(ready, answers, strict=True):
        if isinstance(answer, SlurmError):
            refused.append((group, str(answer)))
            continue
        shards = group[0].shard_count or 1
        for job in group:
            sid = answer if shards == 1 else f"{answer}_{job.shard_index}"
            path = batch.output_pattern.replace("%a", str(job.shard_index or 0))
            links.append(
                SlurmJob(
                    job=job,
                    pool_id=cfg.pool_id,
                    slurm_job_id=sid,
                    output_path=path,
                    submitted_at=now,
                )
            )
            events.append(
                JobEvent(
                    job=job,
                    from_state=job.state,
                    to_state=job.state,
                    actor_label=ACTOR,
                    reason=f"Submitted to Slurm cluster {cfg.cluster_name} as job {sid}",
                    data={"slurm_job_id": sid, "sbatch": batch.command_line()},
                )
            )
            job.pending_reason = "slurm"
            job.pending_message = f"waiting: submitted to Slurm as job {sid}"
            touched.append(job)
    SlurmJob.objects.bulk_create(links)
    JobEvent.objects.bulk_create(events)
    Job.objects.bulk_update(touched, ["pending_reason", "pending_message"])
    return touched


def _fail_refused(refused: list[_Refused]) -> None:
    """The jobs of each refused group fail, with Slurm's words."""
    for group, words in refused:
        for job in group:
            job.failure_reason = f"Slurm refused the job: {words}"[:500]
            job_transition(
                job=job,
                to=JobState.FAILED,
                reason=job.failure_reason,
                actor_label=ACTOR,
                update_fields=("failure_reason",),
            )


def cancel_job(job: Job) -> None:
    """scancel the job's batch job (an array task alone). Our state is already Cancelled."""
    link = SlurmJob.objects.filter(job=job).select_related("pool__slurm").first()
    if link is None:
        return
    try:
        cluster_for(link.pool).scancel(link.slurm_job_id)
    except SlurmError as exc:
        JobEvent.objects.create(
            job=job,
            from_state=job.state,
            to_state=job.state,
            actor_label=ACTOR,
            reason=f"scancel {link.slurm_job_id} failed: {exc}"[:500],
        )


def dry_run(*, pool: Pool, job: Job, shards: int = 1) -> str:
    """Slurm's own answer to `sbatch --test-only` for this job (when and where it would start).
    `job` may be unsaved; raises SlurmError with Slurm's words when Slurm would refuse it."""
    cfg = pool.slurm
    batch = batch_job(cfg, job, shards=shards)
    return cluster_for(pool).sbatch_test_only(batch.args, batch.script)


_TEST_ONLY = re.compile(
    r"Job (?P<id>\d+) to start at (?P<at>\S+) using (?P<cpus>\d+) processors on nodes "
    r"(?P<nodes>\S+) in partition (?P<partition>\S+)"
)


def slurm_dry_run(
    *, pool: Pool, job: Job, shards: int, now: datetime
) -> tuple[bool, datetime | None, str, str]:
    """(would start now, estimated start, wait reason, message) from `sbatch --test-only`:
    Slurm's own answer on its current queue, said to be Slurm's."""
    try:
        words = dry_run(pool=pool, job=job, shards=shards)
    except SlurmError as exc:
        return False, None, "slurm", f"Slurm's answer (sbatch --test-only): it would refuse: {exc}"
    m = _TEST_ONLY.search(words)
    at = None
    if m:
        try:
            at = datetime.fromisoformat(m.group("at")).astimezone()  # Slurm's local time
        except ValueError:
            at = None
    start_now = at is not None and at <= now + timedelta(seconds=5)
    where = f" on {m.group('nodes')} in partition {m.group('partition')}" if m else ""
    when = "now" if start_now else (f"at {at:%Y-%m-%d %H:%M} UTC" if at else "at an unknown time")
    return (
        start_now,
        at or None,
        "" if start_now else "slurm",
        f"Slurm's answer (sbatch --test-only): it would start {when}{where}. ({words})"[:500],
    )
