"""Job dependencies (Slurm's ``--dependency=afterok:…,afterany:…``) and array jobs as a whole.

A job submitted with dependencies is queued with `waiting_on_dependencies`: the cycle does not
plan it. Each cycle that finds such jobs first settles them (`dependencies_settle`):

- every dependency met → released (planned from this cycle on, or handed to Slurm);
- one can no longer be met (an after_ok on a job that failed, was cancelled or rejected) →
  the job fails with that reason, as Slurm's ``kill_invalid_depend`` does;
- otherwise its pending message says what it waits for, in words.

A dependency on an array's id (its first shard's job id, as in Slurm) means every shard.
Jobs of Slurm pools are handed to Slurm with the same dependencies in Slurm's ids
(`scheduler.backends.slurm.submit.slurm_dependency`), so Slurm holds them; this module still
fails them when a dependency can no longer be met (the cycle then `scancel`s them).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from django.db import transaction
from django.db.models import Q

from portal.audit import audit_record
from portal.errors import Conflict, DomainError
from portal.models import Role, User
from portal.selectors import project_list_visible_to
from portal.services import require_role
from scheduler.cycle_requests import request_cycle
from scheduler.models import (
    TERMINAL_STATES,
    DependencyKind,
    Job,
    JobDependency,
    JobEvent,
    JobState,
    Pool,
)
from scheduler.transitions import job_transition

MAX_DEPENDENCIES = 64
UNMEETABLE_STATES = frozenset({JobState.FAILED, JobState.CANCELLED, JobState.REJECTED})
_SPELLINGS = {
    "after_ok": DependencyKind.AFTER_OK,
    "afterok": DependencyKind.AFTER_OK,
    "after_any": DependencyKind.AFTER_ANY,
    "afterany": DependencyKind.AFTER_ANY,
}
_ITEM = re.compile(r"^(?P<kind>[a-z_]+)((:\d+)+)$")

ACTOR = "scheduler"


def dependency_kind(word: str) -> str:
    """Our kind for a spelling (ours or Slurm's); raises DomainError naming the field."""
    kind = _SPELLINGS.get(word.strip().lower())
    if kind is None:
        raise DomainError(
            f"Unknown dependency type {word!r}; use after_ok or after_any.", field="dependencies"
        )
    return str(kind)


def dependencies_parse(text: str) -> tuple[tuple[str, int], ...]:
    """Slurm's syntax: ``after_ok:12:13,after_any:14`` (``afterok``/``afterany`` too)."""
    out: list[tuple[str, int]] = []
    for item in (part.strip() for part in text.replace(" ", "").split(",")):
        if not item:
            continue
        m = _ITEM.match(item.lower())
        if m is None:
            raise DomainError(
                f"Cannot read the dependency {item!r}; write e.g. after_ok:12 or "
                "after_any:12:13 (job ids after the type).",
                field="dependencies",
            )
        kind = dependency_kind(m.group("kind"))
        out += [(kind, int(n)) for n in m.group(2).strip(":").split(":")]
    return tuple(out)


def dependencies_text(deps: Iterable[tuple[str, int]]) -> str:
    """The inverse of `dependencies_parse` (grouped by kind, in order)."""
    by_kind: dict[str, list[int]] = defaultdict(list)
    for kind, job_id in deps:
        by_kind[kind].append(job_id)
    return ",".join(f"{kind}:" + ":".join(str(i) for i in ids) for kind, ids in by_kind.items())


def spec_dependencies_validate(deps: Sequence[tuple[str, int]]) -> None:
    if len(deps) > MAX_DEPENDENCIES:
        raise DomainError(f"At most {MAX_DEPENDENCIES} dependencies.", field="dependencies")
    for kind, job_id in deps:
        if kind not in DependencyKind.values:
            dependency_kind(kind)
        if not isinstance(job_id, int) or job_id < 1:
            raise DomainError(f"{job_id!r} is not a job id.", field="dependencies")
    seen = [job_id for _kind, job_id in deps]
    if len(set(seen)) != len(seen):
        raise DomainError("A job is named twice in the dependencies.", field="dependencies")


# ---------------------------------------------------------------- evaluation


@dataclass(frozen=True)
class Target:
    """What one dependency waits on: a job, or (whole_array) every shard of an array."""

    on: int
    kind: str
    whole_array: bool


@dataclass(frozen=True)
class Verdict:
    met: bool
    dead: str = ""  # why it can never be met ("" while it still can)
    waiting: str = ""  # what it waits for, in words


def is_array_root(job: Job) -> bool:
    return (job.shard_count or 1) > 1 and job.array_parent_id is None


def array_members(root_id: int) -> Q:
    """The shards of the array whose first job is `root_id` (that job included)."""
    return Q(pk=root_id) | Q(array_parent_id=root_id)


def states_of(targets: Iterable[Target]) -> dict[int, list[tuple[int, int | None, str]]]:
    """(job id, shard index, state) of what each `on` covers, in one query."""
    ids: set[int] = set()
    roots: set[int] = set()
    for t in targets:
        (roots if t.whole_array else ids).add(t.on)
    covered: dict[int, list[tuple[int, int | None, str]]] = defaultdict(list)
    if not ids and not roots:
        return covered
    rows = Job.objects.filter(Q(pk__in=ids | roots) | Q(array_parent_id__in=roots)).values_list(
        "pk", "array_parent_id", "shard_index", "state"
    )
    for pk, parent, shard, state in rows:
        if pk in ids:
            covered[pk].append((pk, shard, state))
        if pk in roots:
            covered[pk].append((pk, shard, state))
        elif parent in roots:
            covered[parent].append((pk, shard, state))
    return covered


def judge(target: Target, states: list[tuple[int, int | None, str]]) -> Verdict:
    """One dependency against the states of what it covers."""
    what = f"array {target.on}" if target.whole_array else f"job {target.on}"
    if not states:  # deleted: nothing can ever satisfy it
        return Verdict(False, dead=f"{what} no longer exists")
    ok = target.kind == DependencyKind.AFTER_OK
    done = sum(
        1 for _pk, _i, s in states if (s == JobState.SUCCEEDED if ok else s in TERMINAL_STATES)
    )
    if ok:
        bad = [(pk, i, s) for pk, i, s in states if s in UNMEETABLE_STATES]
        if bad:
            pk, shard, state = bad[0]
            if target.whole_array:
                more = f" (and {len(bad) - 1} more shards)" if len(bad) > 1 else ""
                return Verdict(False, dead=f"{what}: shard {shard} (job {pk}) {state}{more}")
            return Verdict(False, dead=f"{what} {state}")
    if done == len(states):
        return Verdict(True)
    verb = "succeed" if ok else "end"
    if target.whole_array:
        return Verdict(
            False, waiting=f"waiting for {what} to {verb} ({done} of {len(states)} shards done)"
        )
    return Verdict(False, waiting=f"waiting for {what} to {verb}")


def judge_all(
    targets: Sequence[Target], covered: dict[int, list[tuple[int, int | None, str]]]
) -> Verdict:
    verdicts = [judge(t, covered.get(t.on, [])) for t in targets]
    dead = [v.dead for v in verdicts if v.dead]
    if dead:
        return Verdict(False, dead="; ".join(dead))
    waiting = [v.waiting for v in verdicts if not v.met]
    if not waiting:
        return Verdict(True)
    more = f"; and {len(waiting) - 3} more dependencies" if len(waiting) > 3 else ""
    return Verdict(False, waiting="; ".join(waiting[:3]) + more)


def dependencies_resolve(
    *, user: User, deps: Sequence[tuple[str, int]]
) -> tuple[list[Target], Verdict]:
    """The submitted dependencies as targets, each on a job the user may see (else a 400 that
    does not say whether the job exists), with their verdict now. A dependency that can no
    longer be met is refused here, as sbatch refuses it."""
    if not deps:
        return [], Verdict(True)
    ids = [job_id for _kind, job_id in deps]
    seen = {
        j.pk: j
        for j in Job.objects.filter(
            pk__in=ids, project__in=project_list_visible_to(user=user)
        ).only("pk", "shard_count", "array_parent_id")
    }
    missing = [i for i in ids if i not in seen]
    if missing:
        raise DomainError(
            f"Job {missing[0]} does not exist or is not in a project you can see.",
            field="dependencies",
        )
    targets = [Target(on=i, kind=k, whole_array=is_array_root(seen[i])) for k, i in deps]
    verdict = judge_all(targets, states_of(targets))
    if verdict.dead:
        raise DomainError(
            f"This dependency can never be met: {verdict.dead}.", field="dependencies"
        )
    return targets, verdict


def dependency_rows(jobs: Sequence[Job], targets: Sequence[Target]) -> list[JobDependency]:
    return [
        JobDependency(job=job, on_id=t.on, kind=t.kind, whole_array=t.whole_array)
        for job in jobs
        for t in targets
    ]


# ---------------------------------------------------------------- the cycle's step


@dataclass
class Settled:
    released: list[int]
    failed: list[int]
    waiting: int


def targets_of(job_ids: Sequence[int]) -> dict[int, list[Target]]:
    out: dict[int, list[Target]] = defaultdict(list)
    rows = JobDependency.objects.filter(job_id__in=job_ids).values_list(
        "job_id", "on_id", "kind", "whole_array"
    )
    for job_id, on, kind, whole in rows:
        out[job_id].append(Target(on=on, kind=kind, whole_array=whole))
    return out


def dependencies_settle(*, limit: int = 5000) -> Settled:
    """Release the queued jobs whose dependencies are met, fail those whose can no longer be
    met, and say in words what the others wait for (only where that changed)."""
    held = list(
        Job.objects.filter(state=JobState.QUEUED, waiting_on_dependencies=True)
        .order_by("pk")
        .values_list("pk", "pending_message", "slurm__slurm_job_id")[:limit]
    )
    if not held:
        return Settled([], [], 0)
    targets = targets_of([pk for pk, _m, _s in held])
    covered = states_of(t for ts in targets.values() for t in ts)
    released: list[int] = []
    dead: dict[int, str] = {}
    messages: list[Job] = []
    for pk, message, slurm_id in held:
        verdict = judge_all(targets.get(pk, []), covered)
        if verdict.met:
            released.append(pk)
        elif verdict.dead:
            dead[pk] = verdict.dead
        elif slurm_id is None and verdict.waiting[:500] != message:
            messages.append(Job(pk=pk, pending_message=verdict.waiting[:500]))
    if messages:
        for job in messages:
            job.pending_reason = "dependency"
        Job.objects.bulk_update(messages, ["pending_reason", "pending_message"])
    if released:
        _release(released)
    failed = [pk for pk, why in dead.items() if _fail(pk, why)]
    return Settled(released, failed, len(held) - len(released) - len(dead))


def _release(job_ids: list[int]) -> None:
    with transaction.atomic():
        ids = list(
            Job.objects.select_for_update(skip_locked=True)
            .filter(pk__in=job_ids, state=JobState.QUEUED, waiting_on_dependencies=True)
            .values_list("pk", flat=True)
        )
        Job.objects.filter(pk__in=ids, slurm__isnull=True).update(
            waiting_on_dependencies=False, pending_reason="", pending_message=""
        )
        Job.objects.filter(pk__in=ids, slurm__isnull=False).update(waiting_on_dependencies=False)
        JobEvent.objects.bulk_create(
            JobEvent(
                job_id=pk,
                from_state=JobState.QUEUED,
                to_state=JobState.QUEUED,
                actor_label=ACTOR,
                reason="Dependencies met: it may start",
            )
            for pk in ids
        )


def _fail(job_id: int, why: str) -> bool:
    reason = f"dependency can no longer be met: {why}"[:500]
    try:
        with transaction.atomic():
            job = (
                Job.objects.select_for_update(of=("self",))
                .select_related("project", "pool")
                .get(pk=job_id)
            )
            if job.state != JobState.QUEUED:
                return False
            job.failure_reason = reason
            job.waiting_on_dependencies = False
            job_transition(
                job=job,
                to=JobState.FAILED,
                reason=reason,
                actor_label=ACTOR,
                update_fields=("failure_reason", "waiting_on_dependencies"),
            )
            audit_record(
                actor=None,
                action="job.dependency_failed",
                target=job,
                project=job.project,
                data={"reason": reason},
            )
    except (Conflict, Job.DoesNotExist):
        return False
    return True


# ---------------------------------------------------------------- arrays


@dataclass(frozen=True)
class ArrayView:
    root: Job
    shards: list[Job]
    by_state: dict[str, int]

    @property
    def total(self) -> int:
        return len(self.shards)

    @property
    def done(self) -> int:
        return sum(n for s, n in self.by_state.items() if s in TERMINAL_STATES)

    @property
    def succeeded(self) -> int:
        return self.by_state.get(JobState.SUCCEEDED, 0)

    @property
    def failed(self) -> int:
        return self.by_state.get(JobState.FAILED, 0)

    @property
    def percent_done(self) -> int:
        return round(100 * self.done / self.total) if self.total else 0

    @property
    def percent_succeeded(self) -> int:
        return round(100 * self.succeeded / self.total) if self.total else 0


def array_view(root: Job) -> ArrayView:
    """An array's shards in index order, counted by state (`root`: the array's first job)."""
    shards = list(Job.objects.filter(array_members(root.pk)).order_by("shard_index", "pk"))
    by_state: dict[str, int] = defaultdict(int)
    for job in shards:
        by_state[job.state] += 1
    return ArrayView(root=root, shards=shards, by_state=dict(by_state))


@transaction.atomic
def array_retry_failed(*, actor: User, root: Job, remote_addr: str | None = None) -> list[Job]:
    """Queue the array's failed shards again, and only those. Returns them (none: a 409)."""
    require_role(user=actor, project=root.project, roles=(Role.OWNER, Role.MEMBER))
    if not is_array_root(root):
        raise Conflict(f"Job {root.pk} is not an array job.", code="not_an_array")
    if root.pool is not None and root.pool.backend != Pool.Backend.AGENTS:
        raise Conflict(
            "Retrying shards of a Slurm pool's array is not supported yet; "
            "resubmit the failed shards, or requeue them in Slurm (scontrol requeue).",
            code="not_supported",
        )
    failed = list(
        Job.objects.select_for_update()
        .filter(array_members(root.pk), state=JobState.FAILED)
        .order_by("shard_index")
    )
    if not failed:
        raise Conflict(f"Array {root.pk} has no failed shard to retry.", code="nothing_to_retry")
    held = set(
        JobDependency.objects.filter(job__in=failed).values_list("job_id", flat=True).distinct()
    )
    for job in failed:
        job.failure_reason = ""
        job.exit_code = None
        job.finished_at = None
        job.restarts = 0
        job.resume = job.has_checkpoint
        job.waiting_on_dependencies = job.pk in held
        job_transition(
            job=job,
            to=JobState.QUEUED,
            reason=f"Failed shard retried by {actor.email}",
            actor=actor,
            update_fields=(
                "failure_reason",
                "exit_code",
                "finished_at",
                "restarts",
                "resume",
                "waiting_on_dependencies",
            ),
        )
    audit_record(
        actor=actor,
        action="job.array_retry",
        target=root,
        project=root.project,
        data={"shards": [j.shard_index for j in failed], "jobs": [j.pk for j in failed]},
        remote_addr=remote_addr,
    )
    transaction.on_commit(request_cycle)
    return failed
