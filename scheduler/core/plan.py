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
from bisect import insort
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from operator import itemgetter
from types import MappingProxyType

import numpy as np

from scheduler.core.model import (
    MILLI,
    JobRequest,
    ProjectQuota,
    RunningWork,
    Share,
    Snapshot,
    TaskShape,
)
from scheduler.core.reasons import PendingReason
from scheduler.core.scorers import FirstFitScorer, Scorer, choose_row, make_scorer
from scheduler.core.state import BoolArray, ClusterState, Demand

QUEUE_POLICIES = ("fcfs", "sjf", "priority", "fairshare")
_CAPACITY_REASONS = frozenset(
    {
        PendingReason.NO_CAPACITY,
        PendingReason.WAITING_FOR_GANG,
        PendingReason.BLOCKED_BY_RESERVATION,
        PendingReason.WAITING_IN_QUEUE,
        PendingReason.PREEMPTING,
    }
)


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Scheduling policy of a pool.

    ``strict_order``: without backfill, a job blocked for capacity holds back every later job
    (plain FCFS); with ``strict_order=False`` and no backfill, later jobs start whenever they
    fit (greedy). ``pools`` overrides the policy for named pools.
    """

    queue: str = "fcfs"
    scorer: str = "default"
    backfill: bool = True
    preemption: bool = True
    aging_per_hour: float = 1.0
    seed: int = 0
    strict_order: bool = True
    elastic: bool = True
    spread_gangs: bool = True
    estimate_starts: bool = True
    max_estimates: int = 50
    # Preemption searches per cycle: each is costly on a big cluster, and the jobs past the
    # budget get their turn next cycle (Kubernetes likewise preempts for one pod at a time).
    max_preemption_attempts: int = 64
    typical_shapes: tuple[TaskShape, ...] = ()
    pools: Mapping[str, PolicyConfig] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Placement:
    job_id: int
    shares: tuple[Share, ...]
    borrowed: bool = False  # over quota or on another project's reserved GPUs: preemptible
    node_ids: tuple[int, ...] = ()
    gpus: int = 0


@dataclass(frozen=True, slots=True)
class Preemption:
    job_id: int
    for_job_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class Reservation:
    job_id: int
    shares: tuple[Share, ...]
    start_at: float | None
    reason: str = "backfill"


@dataclass(frozen=True, slots=True)
class Resize:
    job_id: int
    gpus: int
    release: tuple[Share, ...] = ()
    add: tuple[Share, ...] = ()


@dataclass(frozen=True, slots=True)
class Pending:
    job_id: int
    reason: PendingReason
    message: str
    position: int
    estimated_start: float | None


@dataclass(frozen=True, slots=True)
class Plan:
    placements: tuple[Placement, ...] = ()
    preemptions: tuple[Preemption, ...] = ()
    reservations: tuple[Reservation, ...] = ()
    pending: Mapping[int, Pending] = field(default_factory=lambda: MappingProxyType({}))
    resizes: tuple[Resize, ...] = ()


# ------------------------------------------------------------------------------ ordering
def order_queue(
    queue: Sequence[JobRequest],
    config: PolicyConfig,
    now: float,
    quotas: Mapping[str, ProjectQuota],
    running: Sequence[RunningWork] = (),
) -> list[JobRequest]:
    """Queue order under the configured policy (ties: submission time, then job id)."""
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
        for w in running:
            running_gpus[w.project] += w.gpu_milli_total / MILLI
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


# ------------------------------------------------------------------------------ helpers
@dataclass(slots=True)
class _Take:
    row: int
    cols: list[int]
    milli: int  # per GPU as requested (1000 = whole)
    gpu_mem: int
    cpu: int
    mem: int


@dataclass(slots=True)
class _Usage:
    total: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    model: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))


_Event = tuple[float, int, RunningWork | list[_Take]]
_BY_TIME = itemgetter(0, 1)  # release events order by (time, job id)


def _end_or_inf(end: float | None, now: float) -> float:
    return max(now, end) if end is not None else math.inf


def _split(total: int, part: int, whole: int) -> int:
    return -(-total * part // whole) if whole > 0 else total


def describe_request(job: JobRequest) -> str:
    """'2 × A100-80GB', '4 GPUs (2 nodes × 2)', '250 milli-GPU (25% of a GPU)'."""
    models = sorted(job.models)
    kind = " or ".join(models) if models else ""
    if job.total_gpus <= 0:
        return "CPU and memory"
    if job.is_fraction:
        s = f"{job.gpu_milli} milli-GPU ({job.gpu_milli / 10:g}% of a GPU"
        return s + (f", {kind})" if kind else ")")
    n = job.total_gpus
    if job.nodes is not None and job.gpus_per_node is not None:
        layout = f" ({job.nodes} nodes × {job.gpus_per_node})"
    else:
        layout = ""
    if kind:
        return f"{n} × {kind}{layout}"
    return f"{n} GPU{'s' if n != 1 else ''}{layout}"


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
    def __init__(
        self,
        snap: Snapshot,
        config: PolicyConfig,
        now: float,
        usage: _Usage,
        running: Sequence[RunningWork],
    ) -> None:
        self.snap = snap
        self.cfg = config
        self.now = now
        self.st = ClusterState.from_snapshot(snap)
        self.st.tie_rank = (
            np.random.default_rng(config.seed).permutation(self.st.n_nodes).astype(np.int64)
        )
        self.rng = np.random.default_rng(config.seed)
        shapes = config.typical_shapes or _shapes_from(snap, running)
        self.scorer: Scorer = make_scorer(config.scorer, shapes)
        self.first_fit = FirstFitScorer()
        self.model_memory = self.st.model_memory()
        self.usage = usage
        self.running = [w for w in running if any(self.st.loc_of_gpu(s.gpu_id) for s in w.shares)]
        self.gone: set[int] = set()  # running jobs chosen as victims
        self.elastic_running = [w for w in self.running if w.elastic_min is not None]
        # preemption order: borrowed work first, then lowest priority, least GPU-time lost;
        # work that is neither preemptible nor borrowed is never a victim, so it is left out
        self.victim_order = sorted(
            (w for w in self.running if w.preemptible or w.borrowed),
            key=lambda w: (
                0 if w.borrowed else 1,
                w.priority,
                w.gpu_milli_total * max(0.0, now - w.started_at),
                w.job_id,
            ),
        )
        self.shrunk: dict[int, list[Share]] = {}
        self.placements: list[Placement] = []
        # Expected releases in time order, kept sorted as work is placed; see `release_events`.
        self.timeline: list[_Event] = sorted(
            ((_end_or_inf(w.expected_end(), now), w.job_id, w) for w in self.running),
            key=_BY_TIME,
        )
        # Per-cycle caches keyed by `epoch` (bumped whenever placed work changes usage or the
        # free GPUs), so a cached answer is never read after the state it came from changed.
        self.quota_cache: dict[tuple[object, ...], tuple[BoolArray, str, int]] = {}
        self.protected_cache: dict[tuple[object, ...], BoolArray] = {}
        self.any_reserved = any(q.reserved for q in snap.quotas.values())
        self.all_models = np.ones(len(self.st.models), dtype=bool)
        self.all_models.flags.writeable = False
        self.free_cache: dict[tuple[object, ...], int] = {}
        self.preemptions: list[Preemption] = []
        self.preempt_attempts = 0
        self.resizes: list[Resize] = []
        self.reservations: list[Reservation] = []
        self.pending: dict[int, Pending] = {}
        self.reserved_mask: BoolArray | None = None
        self.reserve_until: float | None = None
        self.reserve_for: int | None = None
        self.capacity_blocked = False
        self.n_pending = 0
        self.n_estimates = 0
        # requests already found not to fit since the cluster state last changed
        self.epoch = 0
        self.no_fit: set[tuple[object, ...]] = set()
        self.mask_cache: dict[
            tuple[object, ...], tuple[BoolArray, BoolArray, tuple[PendingReason, str] | None]
        ] = {}

    # ------------------------------------------------------------------ masks
    def node_mask(self, job: JobRequest) -> BoolArray:
        st = self.st
        ok = st.schedulable.copy()
        if job.pool is not None:
            ok &= np.array([p == job.pool for p in st.pools], dtype=bool)
        if job.node_selector:
            sel = job.node_selector
            ok &= np.array(
                [all(lb.get(k) == v for k, v in sel.items()) for lb in st.labels], dtype=bool
            )
        return ok

    def model_mask(self, job: JobRequest) -> BoolArray:
        return self.st.model_mask(
            job.models,
            job.min_gpu_memory_mib,
            job.precisions,
            self.snap.model_precisions,
            self.model_memory,
        )

    def demand(self, job: JobRequest, gpus: int, model_ok: BoolArray, cpu: int, mem: int) -> Demand:
        milli = job.gpu_milli if gpus > 0 else 0
        return Demand(gpus, milli, job.gpu_memory_mib, cpu, mem, model_ok, ())

    # ------------------------------------------------------------------ searching
    def find(
        self,
        st: ClusterState,
        job: JobRequest,
        node_ok: BoolArray,
        model_ok: BoolArray,
        blocked: BoolArray | None,
        scorer: Scorer | None = None,
        gpus: int | None = None,
    ) -> list[_Take] | None:
        scorer = scorer or self.scorer
        total = job.total_gpus if gpus is None else gpus
        if job.nodes is not None and job.gpus_per_node is not None and gpus is None:
            return self._find_gang(st, job, node_ok, model_ok, blocked, scorer)
        d = self.demand(job, total, model_ok, job.cpu_milli, job.memory_mib)
        rows, usable = st.feasible_nodes(d, node_ok, blocked)
        choice = choose_row(scorer, st, d, rows, usable, self.rng)
        if choice is not None:
            row, cols = choice
            return [_Take(row, cols, d.milli, d.gpu_memory_mib, d.cpu_milli, d.memory_mib)]
        if total > 1 and not job.is_fraction and self.cfg.spread_gangs:
            return self._find_spread(st, job, total, node_ok, model_ok, blocked)
        return None

    def _find_gang(
        self,
        st: ClusterState,
        job: JobRequest,
        node_ok: BoolArray,
        model_ok: BoolArray,
        blocked: BoolArray | None,
        scorer: Scorer,
    ) -> list[_Take] | None:
        assert job.nodes is not None and job.gpus_per_node is not None
        cpu = _split(job.cpu_milli, 1, job.nodes)
        mem = _split(job.memory_mib, 1, job.nodes)
        d = self.demand(job, job.gpus_per_node, model_ok, cpu, mem)
        remaining = node_ok.copy()
        takes: list[_Take] = []
        for _ in range(job.nodes):
            rows, usable = st.feasible_nodes(d, remaining, blocked)
            choice = choose_row(scorer, st, d, rows, usable, self.rng)
            if choice is None:
                return None
            row, cols = choice
            takes.append(_Take(row, cols, MILLI, 0, cpu, mem))
            remaining[row] = False
        return takes

    def _find_spread(
        self,
        st: ClusterState,
        job: JobRequest,
        total: int,
        node_ok: BoolArray,
        model_ok: BoolArray,
        blocked: BoolArray | None,
    ) -> list[_Take] | None:
        d = self.demand(job, 1, model_ok, 0, 0)
        usable = st.usable_gpus(d, blocked)
        cnt = np.where(node_ok & st.schedulable, usable.sum(axis=1), 0)
        if int(cnt.sum()) < total:
            return None
        rank = st.tie_rank if st.tie_rank is not None else np.arange(st.n_nodes)
        # fewest nodes first: most free GPUs, then the fixed node order
        order = np.lexsort((rank, -cnt))
        for model in np.flatnonzero(model_ok).tolist():  # a gang stays on one GPU model
            of_model = usable & (st.gpu_model == model)
            cnt_model = np.where(cnt > 0, of_model.sum(axis=1), 0)
            if int(cnt_model.sum()) < total:
                continue
            takes: list[_Take] = []
            left = total
            for row in order[cnt_model[order] > 0].tolist():
                k = min(left, int(cnt_model[row]))
                cpu = _split(job.cpu_milli, k, total)
                mem = _split(job.memory_mib, k, total)
                if st.cpu_free[row] < cpu or st.mem_free[row] < mem:
                    continue
                cols = np.flatnonzero(of_model[row])[:k].tolist()
                takes.append(_Take(row, cols, MILLI, 0, cpu, mem))
                left -= k
                if left == 0:
                    return takes
        return None

    # ------------------------------------------------------------------ applying
    def shares_of(self, st: ClusterState, takes: list[_Take]) -> tuple[Share, ...]:
        out = []
        for t in takes:
            node_id = int(st.node_ids[t.row])
            for c in t.cols:
                whole = t.milli >= MILLI
                out.append(
                    Share(
                        node_id=node_id,
                        gpu_id=int(st.gpu_ids[t.row, c]),
                        milli=int(st.gpu_cap[t.row, c]) if whole else t.milli,
                        memory_mib=int(st.gpu_mem_left[t.row, c]) if whole else t.gpu_mem,
                    )
                )
        return tuple(out)

    @staticmethod
    def apply(st: ClusterState, takes: list[_Take]) -> None:
        for t in takes:
            st.take(t.row, t.cols, t.milli, t.gpu_mem, t.cpu, t.mem)

    def release(
        self, st: ClusterState, w: RunningWork, shares: Sequence[Share] | None = None
    ) -> None:
        shares = w.shares if shares is None else shares
        per_row: dict[int, int] = defaultdict(int)
        for s in shares:
            loc = st.loc_of_gpu(s.gpu_id)
            if loc is None:
                continue
            st.give(loc[0], loc[1], s.milli, s.memory_mib)
            per_row[loc[0]] += 1
        n = max(len(w.shares), 1)
        for row, k in per_row.items():
            st.give_cpu(row, _split(w.cpu_milli, k, n), _split(w.memory_mib, k, n))

    def models_of(self, st: ClusterState, takes: list[_Take]) -> list[str]:
        return [st.models[int(st.gpu_model[t.row, c])] for t in takes for c in t.cols]

    # ------------------------------------------------------------------ quota
    def quota_models(self, job: JobRequest, model_ok: BoolArray) -> tuple[BoolArray, str, int]:
        """Models the job may use within quota, why not (empty if fine), and how many GPUs
        (an elastic job may be admitted with fewer, down to its minimum)."""
        q = self.snap.quotas.get(job.project)
        if q is None:
            return model_ok, "", job.total_gpus
        key = (
            self.epoch,
            job.project,
            job.total_gpus,
            job.gpu_milli,
            job.elastic_min,
            job.nodes,
            model_ok.tobytes(),
        )
        hit = self.quota_cache.get(key)
        if hit is None:
            hit = self.quota_cache[key] = self._quota_models(job, q, model_ok)
        return hit

    def _quota_models(
        self, job: JobRequest, q: ProjectQuota, model_ok: BoolArray
    ) -> tuple[BoolArray, str, int]:
        sizes = [job.total_gpus]
        if job.elastic_min is not None and not job.is_fraction and job.nodes is None:
            sizes = list(range(job.total_gpus, max(job.elastic_min, 1) - 1, -1))
        used = self.usage.total[job.project]
        why = ""
        for k in sizes:
            need = job.gpu_milli if job.is_fraction else k * MILLI
            if q.max_gpus is not None and used + need > q.max_gpus * MILLI:
                why = (
                    f"{used / MILLI:g} of {q.max_gpus} GPUs in use, this job needs {need / MILLI:g}"
                )
                continue
            ok = model_ok.copy()
            for i, m in enumerate(self.st.models):
                cap = q.max_gpus_per_model.get(m)
                in_use = self.usage.model[(job.project, m)]
                if ok[i] and cap is not None and in_use + need > cap * MILLI:
                    ok[i] = False
                    why = f"{in_use / MILLI:g} of {cap} {m} in use, this job needs {need / MILLI:g}"
            if ok.any():
                return ok, "", k
        return np.zeros_like(model_ok), why, job.total_gpus

    def protected_models(self, job: JobRequest, need_gpus: int) -> BoolArray:
        """Models whose idle GPUs, after this job, would still cover other projects' unused
        reservations (only those may be used without borrowing)."""
        if not self.any_reserved:
            return self.all_models
        key = (self.epoch, job.project, need_gpus)
        hit = self.protected_cache.get(key)
        if hit is None:
            hit = self.protected_cache[key] = self._protected_models(job, need_gpus)
        return hit

    def _protected_models(self, job: JobRequest, need_gpus: int) -> BoolArray:
        st = self.st
        prot: dict[str, float] = defaultdict(float)
        for proj, q in self.snap.quotas.items():
            if proj == job.project:
                continue
            for m, n in q.reserved.items():
                prot[m] += max(0.0, n - self.usage.model[(proj, m)] / MILLI)
        ok = np.ones(len(st.models), dtype=bool)
        if not prot:
            return ok
        idle = (st.gpu_left == st.gpu_cap) & (st.gpu_cap > 0)
        for i, m in enumerate(st.models):
            if prot.get(m, 0.0) > 0:
                free = int((idle & (st.gpu_model == i)).sum())
                ok[i] = free - need_gpus >= prot[m]
        return ok

    def account(self, job: JobRequest, takes: list[_Take], borrowed: bool) -> None:
        if borrowed:
            return
        for t in takes:
            m = self.st.models[int(self.st.gpu_model[t.row, t.cols[0]])] if t.cols else ""
            milli = t.milli * len(t.cols)
            self.usage.total[job.project] += milli
            if m:
                self.usage.model[(job.project, m)] += milli

    # ------------------------------------------------------------------ main loop
    def run(self, order: Sequence[JobRequest]) -> None:
        for job in order:
            self.consider(job)
        if self.cfg.elastic:
            self.grow()

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
            now=self.now,
            estimated_start=est,
            ending_job=estimate[1] if estimate else None,
            detail=detail,
        )
        self.pending[job.job_id] = Pending(job.job_id, reason, msg, ahead + 1, est)

    def consider(self, job: JobRequest) -> None:
        bad = _validate(job)
        if bad:
            self.pend(job, PendingReason.INVALID_REQUEST, bad)
            return
        q = self.snap.quotas.get(job.project)
        if q is not None and q.budget_exhausted:
            self.pend(job, PendingReason.BUDGET)
            return
        node_ok, model_ok, static = self.request_masks(job)
        if static is not None:
            self.pend(job, static[0], static[1])
            return
        q_models, q_why, admitted = self.quota_models(job, model_ok)
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
        if self.capacity_blocked and not self.cfg.backfill and self.cfg.strict_order:
            self.pend(
                job,
                PendingReason.WAITING_IN_QUEUE,
                f"job {self.reserve_for} is first in line",
                self.maybe_estimate(job, node_ok, model_ok),
            )
            return
        blocked = self.backfill_block(job)
        need_gpus = max(1, job.total_gpus) if job.total_gpus > 0 else 0
        models = q_models
        if not borrowed and need_gpus:
            models = q_models & self.protected_models(job, need_gpus)
        key = self.shape_key(job, models, borrowed, blocked is None)
        takes = None
        if key not in self.no_fit:
            takes = self.find(self.st, job, node_ok, models, blocked)
            if takes is None and not borrowed and need_gpus and (models != q_models).any():
                # only other projects' reserved GPUs are idle: borrow them, preemptibly
                takes = self.find(self.st, job, node_ok, q_models, blocked)
                borrowed = takes is not None
            takes = takes or self.find_elastic(job, node_ok, models, blocked)
            if takes is None:
                self.no_fit.add(key)
        if takes is not None:
            self.place(job, takes, borrowed)
            return
        if blocked is not None and self.fits_unblocked(job, node_ok, models, borrowed):
            self.pend(
                job,
                PendingReason.BLOCKED_BY_RESERVATION,
                f"held for job {self.reserve_for}, next in line, from "
                + ("now" if self.reserve_until is None else "its start")
                + "; shorter jobs may use them meanwhile",
                self.maybe_estimate(job, node_ok, models),
            )
            return
        if self.cfg.elastic and self.try_shrink(job, node_ok, models, borrowed):
            return
        pkey = (*key, "preempt", job.priority, job.preempted_by)
        if (
            self.cfg.preemption
            and pkey not in self.no_fit
            and self.preempt_attempts < self.cfg.max_preemption_attempts
        ):
            self.preempt_attempts += 1
            if self.try_preempt(job, node_ok, models, borrowed):
                return
            self.no_fit.add(pkey)
        self.blocked_for_capacity(job, node_ok, models)

    def request_masks(
        self, job: JobRequest
    ) -> tuple[BoolArray, BoolArray, tuple[PendingReason, str] | None]:
        key = (
            job.pool,
            tuple(sorted(job.node_selector.items())),
            job.models,
            job.min_gpu_memory_mib,
            job.precisions,
            job.gpus,
            job.gpu_milli,
            job.gpu_memory_mib,
            job.nodes,
            job.gpus_per_node,
            job.elastic_min,
        )
        hit = self.mask_cache.get(key)
        if hit is None:
            node_ok = self.node_mask(job)
            model_ok = self.model_mask(job)
            hit = (node_ok, model_ok, self.static_check(job, node_ok, model_ok))
            self.mask_cache[key] = hit
        return hit

    def shape_key(
        self, job: JobRequest, models: BoolArray, borrowed: bool, unblocked: bool
    ) -> tuple[object, ...]:
        return (
            self.epoch,
            len(self.gone),
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
        if self.find(self.st, job, node_ok, models, None) is not None:
            return True
        self.no_fit.add(key)
        return False

    def find_elastic(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray, blocked: BoolArray | None
    ) -> list[_Take] | None:
        if job.elastic_min is None or job.is_fraction or job.nodes is not None:
            return None
        for k in range(job.total_gpus - 1, max(job.elastic_min, 1) - 1, -1):
            takes = self.find(self.st, job, node_ok, model_ok, blocked, gpus=k)
            if takes is not None:
                return takes
        return None

    def static_check(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray
    ) -> tuple[PendingReason, str] | None:
        st = self.st
        if not node_ok.any():
            where = f"pool {job.pool!r}" if job.pool else "any pool"
            sel = ", ".join(f"{k}={v}" for k, v in sorted(job.node_selector.items()))
            return PendingReason.NODE_CONSTRAINTS, f"no schedulable node in {where}" + (
                f" with labels {sel}" if sel else ""
            )
        if job.total_gpus <= 0:
            return None
        gpu_ok = st.gpu_model_ok(model_ok) & node_ok[:, None]
        if job.is_fraction:
            gpu_ok &= st.gpu_share_ok & (st.gpu_cap >= job.gpu_milli)
            gpu_ok &= st.gpu_mem >= job.gpu_memory_mib
        wants = []
        if job.models:
            wants.append(" or ".join(sorted(job.models)))
        if job.min_gpu_memory_mib:
            wants.append(f"at least {job.min_gpu_memory_mib} MiB GPU memory")
        if job.precisions:
            wants.append("support for " + ", ".join(sorted(job.precisions)))
        if job.is_fraction:
            wants.append("GPU sharing")
        wanted = "; ".join(wants) or "a GPU"
        if not gpu_ok.any():
            return PendingReason.NO_MATCHING_GPU, f"it needs {wanted}"
        per_node = gpu_ok.sum(axis=1)
        if job.nodes is not None and job.gpus_per_node is not None:
            enough = int((per_node >= job.gpus_per_node).sum())
            if enough < job.nodes:
                return PendingReason.NO_MATCHING_GPU, (
                    f"it needs {job.nodes} nodes with {job.gpus_per_node} GPUs ({wanted}) each, "
                    f"the pool has {enough}"
                )
        else:
            lowest = job.elastic_min or job.total_gpus
            have = int(per_node.max()) if not self.cfg.spread_gangs else int(per_node.sum())
            if have < lowest:
                return PendingReason.NO_MATCHING_GPU, (
                    f"it needs {lowest} GPUs ({wanted}), the pool has {have}"
                )
        return None

    def backfill_block(self, job: JobRequest) -> BoolArray | None:
        if self.reserved_mask is None:
            return None
        if (
            self.reserve_until is not None
            and job.runtime_estimate_s is not None
            and self.now + job.runtime_estimate_s <= self.reserve_until
        ):
            return None  # ends before the head job can start: does not delay it
        return self.reserved_mask

    def place(self, job: JobRequest, takes: list[_Take], borrowed: bool) -> None:
        shares = self.shares_of(self.st, takes)
        self.apply(self.st, takes)
        self.account(job, takes, borrowed)
        nodes = tuple(dict.fromkeys(int(self.st.node_ids[t.row]) for t in takes))
        gpus = sum(len(t.cols) for t in takes)
        self.placements.append(Placement(job.job_id, shares, borrowed, nodes, gpus))
        self.epoch += 1
        end = None if job.runtime_estimate_s is None else self.now + job.runtime_estimate_s
        insort(self.timeline, (_end_or_inf(end, self.now), job.job_id, takes), key=_BY_TIME)

    # ------------------------------------------------------------------ estimates
    def release_events(self) -> list[_Event]:
        """Expected releases: (time, job id, what), unknown ends last (at +inf).

        Running work (less the victims) and what this cycle placed, in (time, job id) order:
        sorted once, then kept in order as placements and preemptions happen.
        """
        return self.timeline

    def _release_event(self, st: ClusterState, what: RunningWork | list[_Take]) -> None:
        if isinstance(what, list):
            for t in what:
                for c in t.cols:
                    milli = t.milli if t.milli < MILLI else int(st.gpu_cap[t.row, c])
                    st.give(t.row, c, milli, t.gpu_mem)
                st.give_cpu(t.row, t.cpu, t.mem)
        else:
            self.release(st, what, self.shrunk.get(what.job_id, what.shares))

    def earliest(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray
    ) -> tuple[float | None, int | None, list[_Take] | None]:
        """When the job would fit if running work ended as estimated (unknown ends last).

        Fitting only gets easier as work ends, so gallop over the release events, then
        binary-search the first one after which the job fits: O(log n) placement checks.
        """
        st = self.st.copy()
        for w in self.running:
            if w.job_id in self.gone:
                self.release(st, w)
        events = self.release_events()

        def fits(state: ClusterState) -> list[_Take] | None:
            return self.find(state, job, node_ok, model_ok, None, self.first_fit)

        done, step = 0, 1
        while done < len(events):
            upto = min(len(events), done + step)
            lo_state = st.copy()
            for _t, _j, what in events[done:upto]:
                self._release_event(st, what)
            if fits(st) is not None:
                lo, hi = done, upto  # does not fit after `lo` events, fits after `hi`
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    trial = lo_state.copy()
                    for _t, _j, what in events[lo:mid]:
                        self._release_event(trial, what)
                    if fits(trial) is not None:
                        hi = mid
                    else:
                        lo, lo_state = mid, trial
                final = lo_state
                for _t, _j, what in events[lo:hi]:
                    self._release_event(final, what)
                t_end, jid, _what = events[hi - 1]
                return (None if math.isinf(t_end) else t_end), jid, fits(final)
            done, step = upto, step * 2
        return None, None, None

    def maybe_estimate(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray
    ) -> tuple[float, int | None] | None:
        if not self.cfg.estimate_starts or self.n_estimates >= self.cfg.max_estimates:
            return None
        self.n_estimates += 1
        t, jid, _ = self.earliest(job, node_ok, model_ok)
        return (t, jid) if t is not None else None

    def blocked_for_capacity(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray
    ) -> None:
        first = not self.capacity_blocked
        self.capacity_blocked = True
        estimate: tuple[float, int | None] | None = None
        if first:
            self.reserve_for = job.job_id
        if first and self.cfg.backfill:
            t, jid, takes = self.earliest(job, node_ok, model_ok)
            if takes is not None:
                mask = np.zeros(self.st.gpu_left.shape, dtype=bool)
                for tk in takes:
                    mask[tk.row, tk.cols] = True
                self.reserved_mask = mask
                self.reserve_until = t
                self.reservations.append(
                    Reservation(job.job_id, self.shares_of(self.st, takes), t, "backfill")
                )
            if t is not None:
                estimate = (t, jid)
        else:
            estimate = self.maybe_estimate(job, node_ok, model_ok)
        reason = PendingReason.NO_CAPACITY
        detail = ""
        gang = job.nodes is not None or (job.total_gpus > 1 and self.cfg.spread_gangs)
        if gang and not job.is_fraction:
            key = (self.epoch, len(self.gone), model_ok.tobytes(), node_ok.tobytes())
            free = self.free_cache.get(key)
            if free is None:
                d = self.demand(job, 1, model_ok, 0, 0)
                free = int((self.st.usable_gpus(d) & node_ok[:, None]).sum())
                self.free_cache[key] = free
            if free >= job.total_gpus:
                reason = PendingReason.WAITING_FOR_GANG
                detail = f"{free} matching GPUs are free, but not in the required layout"
        self.pend(job, reason, detail, estimate)

    # ------------------------------------------------------------------ elastic
    def try_shrink(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray, borrowed: bool
    ) -> bool:
        cands = [
            w
            for w in self.elastic_running
            if w.job_id not in self.gone
            and w.priority <= job.priority
            and len(self.shrunk.get(w.job_id, w.shares)) > (w.elastic_min or 0)
        ]
        if not cands:
            return False
        cands.sort(key=lambda w: (w.priority, w.job_id))
        st = self.st.copy()
        released: dict[int, list[Share]] = defaultdict(list)
        for w in cands:
            current = list(self.shrunk.get(w.job_id, w.shares))
            min_keep = w.elastic_min or 0
            while len(current) > min_keep:
                s = current.pop()
                released[w.job_id].append(s)
                self.release(st, replace(w, cpu_milli=0, memory_mib=0), [s])
                takes = self.find(st, job, node_ok, model_ok, self.backfill_block(job))
                if takes is not None:
                    for wid, shares in released.items():
                        ww = next(x for x in self.running if x.job_id == wid)
                        self.release(self.st, replace(ww, cpu_milli=0, memory_mib=0), shares)
                        keep = [x for x in self.shrunk.get(wid, ww.shares) if x not in shares]
                        self.shrunk[wid] = keep
                        self.resizes.append(Resize(wid, len(keep), release=tuple(shares)))
                    self.epoch += 1
                    takes = self.find(self.st, job, node_ok, model_ok, self.backfill_block(job))
                    assert takes is not None
                    self.place(job, takes, borrowed)
                    return True
        return False

    def grow(self) -> None:
        if any(p.reason in _CAPACITY_REASONS for p in self.pending.values()):
            return  # idle GPUs are promised to waiting jobs
        st = self.st
        for w in sorted(self.running, key=lambda x: (-x.priority, x.job_id)):
            if w.elastic_max is None or w.job_id in self.gone:
                continue
            shares = list(self.shrunk.get(w.job_id, w.shares))
            want = w.elastic_max - len(shares)
            if want <= 0 or not shares:
                continue
            q = self.snap.quotas.get(w.project)
            if q is not None and q.max_gpus is not None and not w.borrowed:
                room = (q.max_gpus * MILLI - self.usage.total[w.project]) // MILLI
                want = min(want, int(room))
            locs = [st.loc_of_gpu(s.gpu_id) for s in shares]
            models = {int(st.gpu_model[loc]) for loc in locs if loc is not None}
            rows = list(dict.fromkeys(loc[0] for loc in locs if loc is not None))
            idle = (st.gpu_left == st.gpu_cap) & (st.gpu_cap > 0) & st.schedulable[:, None]
            idle &= np.isin(st.gpu_model, list(models))
            other = [r for r in np.flatnonzero(idle.any(axis=1)).tolist() if r not in rows]
            added: list[Share] = []
            for row in rows + other:
                for c in np.flatnonzero(idle[row]).tolist():
                    if len(added) >= want:
                        break
                    added.append(
                        Share(
                            int(st.node_ids[row]),
                            int(st.gpu_ids[row, c]),
                            int(st.gpu_cap[row, c]),
                            int(st.gpu_mem_left[row, c]),
                        )
                    )
                    st.take(row, [c], MILLI, 0, 0, 0)
                    idle[row, c] = False
            if added:
                if not w.borrowed:
                    self.usage.total[w.project] += sum(s.milli for s in added)
                self.resizes.append(Resize(w.job_id, len(shares) + len(added), add=tuple(added)))

    # ------------------------------------------------------------------ preemption
    def try_preempt(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray, borrowed: bool
    ) -> bool:
        def eligible(w: RunningWork) -> bool:
            if w.job_id in self.gone or w.job_id in job.preempted_by:
                return False
            if self.now - w.started_at < w.min_runtime_s:
                return False  # inside its minimum runtime
            if w.priority < job.priority and (w.preemptible or w.borrowed):
                return True
            # borrowed work is reclaimed by in-quota work of another project, any priority
            return w.borrowed and not borrowed and w.project != job.project

        st = self.st.copy()
        chosen: list[RunningWork] = []
        found = False
        for w in self.victim_order:
            if not w.borrowed and w.priority >= job.priority:
                break  # sorted: borrowed work first, then by priority; nothing eligible follows
            if not eligible(w):
                continue
            self.release(st, w, self.shrunk.get(w.job_id, w.shares))
            chosen.append(w)
            if self.find(st, job, node_ok, model_ok, None, self.first_fit) is not None:
                found = True
                break
        if not found:
            return False
        # drop victims that turn out unnecessary (latest first)
        for w in list(reversed(chosen[:-1])):
            trial = self.st.copy()
            for v in chosen:
                if v is not w:
                    self.release(trial, v, self.shrunk.get(v.job_id, v.shares))
            if self.find(trial, job, node_ok, model_ok, None, self.first_fit) is not None:
                chosen.remove(w)
        gone = {v.job_id for v in chosen}
        self.timeline = [e for e in self.timeline if e[1] not in gone]
        for v in chosen:
            self.gone.add(v.job_id)
            why = (
                "reclaiming borrowed capacity"
                if v.borrowed and v.priority >= job.priority
                else f"priority {job.priority} job needs its GPUs (victim priority {v.priority})"
            )
            self.preemptions.append(Preemption(v.job_id, job.job_id, why))
        names = ", ".join(str(v.job_id) for v in chosen)
        n = len(chosen)
        self.pend(
            job,
            PendingReason.PREEMPTING,
            f"waiting for {n} lower-priority job{'s' if n != 1 else ''} ({names}) to stop",
            (self.now, None),
        )
        # hold the victims' GPUs for this job: nobody else may take them this cycle
        return True


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
    usage = _Usage()
    model_of = {g.gpu_id: g.model for n in snapshot.nodes for g in n.gpus}
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
        planner.run(order_queue(jobs, cfg, now, snapshot.quotas, running))
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
