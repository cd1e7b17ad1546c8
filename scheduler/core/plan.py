"""`plan(snapshot, queue, config, now)`: one scheduling cycle, as a pure function.

Steps, per pool: order the queue (FCFS, shortest-job-first, priority with aging, or fair share),
then for each job in order: admission (budget, constraints, quota, reserved capacity of other
projects), placement by the configured scorer, and — if it does not fit — elastic shrinking,
then preemption; the first job blocked for capacity gets a reservation and later jobs backfill
only where they do not delay it (EASY backfill). Elastic jobs grow into GPUs left idle. Every
job not placed gets a `Pending` with a reason, a message, its queue position and an estimated
start. The same inputs and seed give the same plan.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace
from types import MappingProxyType

import numpy as np

from scheduler.core.model import (
    MILLI,
    JobRequest,
    ProjectQuota,
    RunningWork,
    Snapshot,
    TaskShape,
    device_share_milli,
)
from scheduler.core.planning.caches import EpochSet
from scheduler.core.planning.context import Event, PlanningContext, Take, Usage
from scheduler.core.planning.decisions import (
    QUEUE_POLICIES,
    Pending,
    Placement,
    Plan,
    PolicyConfig,
    Preemption,
    Reservation,
    Resize,
)
from scheduler.core.planning.elastic import Elastic
from scheduler.core.planning.estimates import StartEstimator
from scheduler.core.planning.preemption import Preemptor
from scheduler.core.planning.quota import QuotaBook
from scheduler.core.planning.reservations import Backfill
from scheduler.core.planning.search import (
    FreeGpuCount,
    PlacementSearch,
    RequestMasks,
    shares_of,
    take,
)
from scheduler.core.reasons import PendingReason
from scheduler.core.scorers import make_scorer
from scheduler.core.state import BoolArray, ClusterState

_CAPACITY_REASONS = frozenset(
    {
        PendingReason.NO_CAPACITY,
        PendingReason.WAITING_FOR_GANG,
        PendingReason.BLOCKED_BY_RESERVATION,
        PendingReason.WAITING_IN_QUEUE,
        PendingReason.PREEMPTING,
    }
)
_Usage = Usage  # the name the planner's own tests use


# ------------------------------------------------------------------------------ ordering
def order_queue(
    queue: Sequence[JobRequest],
    config: PolicyConfig,
    now: float,
    quotas: Mapping[str, ProjectQuota],
    running: Sequence[RunningWork] = (),
    capacity_of: Mapping[int, int] | None = None,
) -> list[JobRequest]:
    """Queue order under the configured policy (ties: submission time, then job id).

    `capacity_of`: each GPU's capacity by id (fair share counts a running share as the part
    of its device it holds, `device_share_milli`; a GPU not in it counts as exclusive)."""
    if config.queue == "fcfs":
        return sorted(queue, key=lambda j: (j.submitted_at, j.job_id))
    if config.queue == "sjf":
        return sorted(
            queue,
            key=lambda j: (
                math.inf if j.runtime_estimate_s is None else j.runtime_estimate_s,
                j.submitted_at,
                j.job_id,
            ),
        )
    if config.queue == "priority":

        def eff(j: JobRequest) -> float:
            return j.priority + config.aging_per_hour * max(0.0, now - j.submitted_at) / 3600.0

        return sorted(queue, key=lambda j: (-eff(j), j.submitted_at, j.job_id))
    if config.queue == "fairshare":
        # share = (decayed GPU-hours + GPUs running now × 1 h + earlier queued demand) / weight
        running_gpus: dict[str, float] = defaultdict(float)
        capacity = capacity_of or {}
        for w in running:
            for s in w.shares:
                held = device_share_milli(s.milli, capacity.get(s.gpu_id, MILLI))
                running_gpus[w.project] += held / MILLI
        acc: dict[str, float] = {}
        keyed = []
        for j in sorted(queue, key=lambda j: (-j.priority, j.submitted_at, j.job_id)):
            q = quotas.get(j.project, ProjectQuota())
            weight = q.weight if q.weight > 0 else 1e-9
            if j.project not in acc:
                acc[j.project] = q.decayed_usage + running_gpus[j.project]
            keyed.append((acc[j.project] / weight, j.submitted_at, j.job_id, j))
            hours = (j.runtime_estimate_s or 3600) / 3600.0
            acc[j.project] += j.gpu_milli_total / MILLI * hours
        keyed.sort(key=lambda k: k[:3])
        return [k[3] for k in keyed]
    raise ValueError(
        f"unknown queue policy {config.queue!r}; choose one of {', '.join(QUEUE_POLICIES)}"
    )


def describe_request(job: JobRequest) -> str:
    """'2 × A100-80GB', '4 GPUs (2 nodes × 2)', '250 milli-GPU (25% of a GPU)'."""
    models = sorted(job.models)
    kind = " or ".join(models) if models else ""
    if job.total_gpus <= 0:
        return "CPU and memory" + _on_node(job)
    if job.is_fraction:
        s = f"{job.gpu_milli} milli-GPU ({job.gpu_milli / 10:g}% of a GPU"
        return s + (f", {kind})" if kind else ")") + _on_node(job)
    n = job.total_gpus
    if job.nodes is not None and job.gpus_per_node is not None:
        layout = f" ({job.nodes} nodes × {job.gpus_per_node})"
    else:
        layout = ""
    what = f"{n} × {kind}{layout}" if kind else f"{n} GPU{'s' if n != 1 else ''}{layout}"
    return what + _on_node(job)


def _on_node(job: JobRequest) -> str:
    """' on node-3 (its volume 'ckpt' is there)' for a job pinned to one node, else ''."""
    if job.node is None:
        return ""
    return f" on node {job.node}" + (f" ({job.node_why})" if job.node_why else "")


def _validate(job: JobRequest) -> str | None:
    if job.nodes is not None or job.gpus_per_node is not None:
        if not job.nodes or not job.gpus_per_node or job.nodes < 1 or job.gpus_per_node < 1:
            return "a gang needs both nodes and GPUs per node, each at least 1"
        if job.is_fraction:
            return "a gang cannot use fractions of a GPU"
    if job.gpus < 0:
        return "the GPU count cannot be negative"
    if job.gpu_milli <= 0 or job.gpu_milli > MILLI:
        return "the GPU share must be between 1 and 1000 milli-GPU"
    if job.is_fraction and job.gpus != 1:
        return "a fraction of a GPU can only be requested for one GPU"
    if job.elastic_min is not None and job.elastic_min > job.total_gpus:
        return "the elastic minimum is above the requested GPUs"
    if job.cpu_milli < 0 or job.memory_mib < 0:
        return "CPU and memory cannot be negative"
    return None


# ------------------------------------------------------------------------------ planner
class _Planner:
    """One pool's cycle: takes the queue in order and, for each job, asks its collaborators
    (request masks, quota, placement search, backfill, elastic shrink, preemption, start
    estimates) and records the outcome: a placement or a pending reason."""

    def __init__(
        self,
        snap: Snapshot,
        config: PolicyConfig,
        now: float,
        usage: Usage,
        running: Sequence[RunningWork],
    ) -> None:
        st = ClusterState.from_snapshot(snap)
        st.tie_rank = np.random.default_rng(config.seed).permutation(st.n_nodes).astype(np.int64)
        self.ctx = ctx = PlanningContext(
            snap=snap,
            cfg=config,
            now=now,
            st=st,
            usage=usage,
            running=[w for w in running if any(st.loc_of_gpu(s.gpu_id) for s in w.shares)],
            rng=np.random.default_rng(config.seed),
        )
        shapes = config.typical_shapes or _shapes_from(snap, running)
        self.masks = RequestMasks(ctx)
        self.search = PlacementSearch(ctx, make_scorer(config.scorer, shapes))
        self.quota = QuotaBook(ctx)
        self.estimates = StartEstimator(ctx, self.search)
        self.backfill = Backfill(ctx)
        self.preemptor = Preemptor(ctx, self.search)
        self.elastic = Elastic(ctx, self.search, self.quota)
        self.free_gpus = FreeGpuCount(ctx)
        # request shapes already found not to fit since the cluster state last changed
        self.no_fit: EpochSet[tuple[object, ...]] = EpochSet(ctx.epoch)
        self.placements: list[Placement] = []
        self.pending: dict[int, Pending] = {}
        self.n_pending = 0

    # ------------------------------------------------------------------ results
    @property
    def gone(self) -> set[int]:
        return self.ctx.gone

    @property
    def preemptions(self) -> list[Preemption]:
        return self.preemptor.preemptions

    @property
    def reservations(self) -> list[Reservation]:
        return self.backfill.reservations

    @property
    def resizes(self) -> list[Resize]:
        return self.elastic.resizes

    def release_events(self) -> list[Event]:
        return self.estimates.release_events()

    # ------------------------------------------------------------------ main loop
    def run(self, order: Sequence[JobRequest]) -> None:
        for job in order:
            self.consider(job)
        if self.ctx.cfg.elastic and not any(
            p.reason in _CAPACITY_REASONS for p in self.pending.values()
        ):  # idle GPUs are promised to waiting jobs
            self.elastic.grow()

    def pend(
        self,
        job: JobRequest,
        reason: PendingReason,
        detail: str = "",
        estimate: tuple[float, int | None] | None = None,
    ) -> None:
        ahead = self.n_pending
        self.n_pending += 1
        est = estimate[0] if estimate else None
        msg = reason.message(
            what=describe_request(job),
            ahead=ahead,
            now=self.ctx.now,
            estimated_start=est,
            ending_job=estimate[1] if estimate else None,
            detail=detail,
        )
        self.pending[job.job_id] = Pending(job.job_id, reason, msg, ahead + 1, est)

    def consider(self, job: JobRequest) -> None:
        cfg, st = self.ctx.cfg, self.ctx.st
        bad = _validate(job)
        if bad:
            self.pend(job, PendingReason.INVALID_REQUEST, bad)
            return
        q = self.ctx.snap.quotas.get(job.project)
        if q is not None and (q.budget_exhausted or (q.budget_capped and not job.preemptible)):
            self.pend(job, PendingReason.BUDGET)
            return
        node_ok, model_ok, static = self.masks.of(job)
        if static is not None:
            self.pend(job, static[0], static[1])
            return
        q_models, q_why, admitted = self.quota.quota_models(job, model_ok)
        borrowed = False
        if admitted < job.total_gpus:  # elastic job admitted smaller to stay within quota
            job = replace(
                job, gpus=admitted, elastic_min=min(job.elastic_min or admitted, admitted)
            )
        if not q_models.any():
            if q is not None and q.allow_borrowing:
                borrowed, q_models = True, model_ok
            else:
                self.pend(job, PendingReason.QUOTA, q_why or "no quota for these GPU models")
                return
        if self.backfill.capacity_blocked and not cfg.backfill and cfg.strict_order:
            self.pend(
                job,
                PendingReason.WAITING_IN_QUEUE,
                f"job {self.backfill.reserve_for} is first in line",
                self.estimates.maybe_estimate(job, node_ok, model_ok),
            )
            return
        blocked = self.backfill.block_for(job)
        need_gpus = max(1, job.total_gpus) if job.total_gpus > 0 else 0
        models = q_models
        if not borrowed and need_gpus:
            models = q_models & self.quota.protected_models(job, need_gpus)
        key = self.shape_key(job, models, borrowed, blocked is None)
        takes = None
        if key not in self.no_fit:
            takes = self.search.find(st, job, node_ok, models, blocked)
            if takes is None and not borrowed and need_gpus and (models != q_models).any():
                # only other projects' reserved GPUs are idle: borrow them, preemptibly
                takes = self.search.find(st, job, node_ok, q_models, blocked)
                borrowed = takes is not None
            takes = takes or self.search.find_elastic(job, node_ok, models, blocked)
            if takes is None:
                self.no_fit.add(key)
        if takes is not None:
            self.place(job, takes, borrowed)
            return
        if blocked is not None and self.fits_unblocked(job, node_ok, models, borrowed):
            self.pend(
                job,
                PendingReason.BLOCKED_BY_RESERVATION,
                f"held for job {self.backfill.reserve_for}, next in line, from "
                + ("now" if self.backfill.reserve_until is None else "its start")
                + "; shorter jobs may use them meanwhile",
                self.estimates.maybe_estimate(job, node_ok, models),
            )
            return
        if cfg.elastic:
            takes = self.elastic.shrink_for(job, node_ok, models, blocked)
            if takes is not None:
                self.place(job, takes, borrowed)
                return
        pkey = (*key, "preempt", job.priority, job.preempted_by)
        if pkey not in self.no_fit and self.preemptor.may_try():
            self.preemptor.attempts += 1
            if self.try_preempt(job, node_ok, models, borrowed):
                return
            self.no_fit.add(pkey)
        self.blocked_for_capacity(job, node_ok, models)

    def shape_key(
        self, job: JobRequest, models: BoolArray, borrowed: bool, unblocked: bool
    ) -> tuple[object, ...]:
        return (
            len(self.ctx.gone),
            job.gpus,
            job.gpu_milli,
            job.gpu_memory_mib,
            job.nodes,
            job.gpus_per_node,
            job.cpu_milli,
            job.memory_mib,
            job.elastic_min,
            job.pool,
            tuple(sorted(job.node_selector.items())),
            job.node,
            models.tobytes(),
            borrowed,
            unblocked,
        )

    def fits_unblocked(
        self, job: JobRequest, node_ok: BoolArray, models: BoolArray, borrowed: bool
    ) -> bool:
        key = self.shape_key(job, models, borrowed, True)
        if key in self.no_fit:
            return False
        if self.search.find(self.ctx.st, job, node_ok, models, None) is not None:
            return True
        self.no_fit.add(key)
        return False

    def place(self, job: JobRequest, takes: list[Take], borrowed: bool) -> None:
        st = self.ctx.st
        shares = shares_of(st, takes)
        take(st, takes)
        self.quota.account(job, takes, borrowed)
        nodes = tuple(dict.fromkeys(int(st.node_ids[t.row]) for t in takes))
        gpus = sum(len(t.cols) for t in takes)
        self.placements.append(Placement(job.job_id, shares, borrowed, nodes, gpus))
        self.ctx.epoch.bump()
        self.estimates.placed(job, takes)

    def try_preempt(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray, borrowed: bool
    ) -> bool:
        victims = self.preemptor.victims_for(job, node_ok, model_ok, borrowed)
        if victims is None:
            return False
        self.estimates.stopped({v.job_id for v in victims})
        self.preemptor.preempt(job, victims)
        names = ", ".join(str(v.job_id) for v in victims)
        n = len(victims)
        self.pend(
            job,
            PendingReason.PREEMPTING,
            f"waiting for {n} lower-priority job{'s' if n != 1 else ''} ({names}) to stop",
            (self.ctx.now, None),
        )
        # hold the victims' GPUs for this job: nobody else may take them this cycle
        return True

    def blocked_for_capacity(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray
    ) -> None:
        cfg = self.ctx.cfg
        first = self.backfill.first_blocked(job)
        estimate: tuple[float, int | None] | None = None
        if first and cfg.backfill:
            t, jid, takes = self.estimates.earliest(job, node_ok, model_ok)
            if takes is not None:
                self.backfill.reserve(job, t, takes)
            if t is not None:
                estimate = (t, jid)
        else:
            estimate = self.estimates.maybe_estimate(job, node_ok, model_ok)
        reason = PendingReason.NO_CAPACITY
        detail = ""
        gang = job.nodes is not None or (job.total_gpus > 1 and cfg.spread_gangs)
        if gang and not job.is_fraction:
            free = self.free_gpus.of(job, node_ok, model_ok)
            if free >= job.total_gpus:
                reason = PendingReason.WAITING_FOR_GANG
                detail = f"{free} matching GPUs are free, but not in the required layout"
        self.pend(job, reason, detail, estimate)


def _shapes_from(snap: Snapshot, running: Sequence[RunningWork]) -> tuple[TaskShape, ...]:
    """Typical shapes when none are configured: what runs now, by popularity."""
    counts: dict[tuple[int, int, int], int] = defaultdict(int)
    for w in running:
        n = w.gpu_count
        milli = max((s.milli for s in w.shares), default=0)
        counts[(w.cpu_milli, min(milli, MILLI), n)] += 1
    shapes = [TaskShape(c, m, n, frozenset(), float(k)) for (c, m, n), k in counts.items()]
    if not shapes:
        shapes = [TaskShape(0, MILLI, 1, frozenset(), 1.0)]
    return tuple(sorted(shapes, key=lambda s: (-s.weight, s.cpu_milli, s.gpu_milli, s.gpus)))


# ------------------------------------------------------------------------------ entry point
def plan(
    snapshot: Snapshot,
    queue: Sequence[JobRequest],
    config: PolicyConfig,
    now: float,
) -> Plan:
    """Decide one scheduling cycle. Pure: same inputs and seed give the same plan."""
    if config.queue not in QUEUE_POLICIES:
        raise ValueError(f"unknown queue policy {config.queue!r}")
    usage = Usage()
    model_of = {g.gpu_id: g.model for n in snapshot.nodes for g in n.gpus}
    capacity_of = {g.gpu_id: g.capacity_milli for n in snapshot.nodes for g in n.gpus}
    for w in snapshot.running:
        if w.borrowed:
            continue
        for s in w.shares:  # a whole oversubscribed GPU still counts as one GPU
            usage.total[w.project] += min(s.milli, MILLI)
            m = model_of.get(s.gpu_id, "")
            if m:
                usage.model[(w.project, m)] += min(s.milli, MILLI)
    parts: list[tuple[PolicyConfig, Snapshot, list[JobRequest]]] = []
    special = set(config.pools)
    for pool, cfg in sorted(config.pools.items()):
        nodes = tuple(n for n in snapshot.nodes if n.pool == pool)
        jobs = [j for j in queue if j.pool == pool]
        parts.append(
            (replace(cfg, pools=MappingProxyType({})), replace(snapshot, nodes=nodes), jobs)
        )
    rest_nodes = tuple(n for n in snapshot.nodes if n.pool not in special)
    rest_jobs = [j for j in queue if j.pool not in special]
    parts.append((config, replace(snapshot, nodes=rest_nodes), rest_jobs))
    placements: list[Placement] = []
    preemptions: list[Preemption] = []
    reservations: list[Reservation] = []
    resizes: list[Resize] = []
    pending: dict[int, Pending] = {}
    for cfg, snap, jobs in parts:
        if not jobs and not cfg.elastic:
            continue
        node_ids = {n.node_id for n in snap.nodes}
        running = [w for w in snapshot.running if any(s.node_id in node_ids for s in w.shares)]
        planner = _Planner(snap, cfg, now, usage, running)
        planner.run(order_queue(jobs, cfg, now, snapshot.quotas, running, capacity_of))
        placements += planner.placements
        preemptions += planner.preemptions
        reservations += planner.reservations
        resizes += planner.resizes
        pending.update(planner.pending)
    return Plan(
        placements=tuple(placements),
        preemptions=tuple(preemptions),
        reservations=tuple(reservations),
        pending=MappingProxyType(pending),
        resizes=tuple(resizes),
    )


__all__ = [
    "QUEUE_POLICIES",
    "Pending",
    "Placement",
    "Plan",
    "PolicyConfig",
    "Preemption",
    "Reservation",
    "Resize",
    "describe_request",
    "order_queue",
    "plan",
]
