"""Where a request may go and where it fits: request masks, then placement search on one node,
as a gang of nodes, or spread over as few nodes as possible; and taking/giving back GPUs."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

import numpy as np

from scheduler.core.model import (
    GANG_REASON_LABEL,
    MILLI,
    JobRequest,
    RunningWork,
    Share,
    runs_gang_members,
)
from scheduler.core.planning.caches import EpochCache, Memo
from scheduler.core.planning.context import PlanningContext, Take, split
from scheduler.core.reasons import PendingReason
from scheduler.core.scorers import Scorer, choose_row
from scheduler.core.state import BoolArray, ClusterState, Demand

MaskKey = tuple[object, ...]
Masks = tuple[BoolArray, BoolArray, tuple[PendingReason, str] | None]


class RequestMasks:
    """The nodes and GPU models a request may use, and whether it can ever fit (a static
    pending reason), memoized per request shape for the cycle."""

    def __init__(self, ctx: PlanningContext) -> None:
        self.ctx = ctx
        self.model_memory = ctx.st.model_memory()
        self.cache: Memo[MaskKey, Masks] = Memo()
        self._gang_ok: BoolArray | None = None

    def of(self, job: JobRequest) -> Masks:
        key = (
            job.pool,
            tuple(sorted(job.node_selector.items())),
            job.node,
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
        hit = self.cache.get(key)
        if hit is None:
            node_ok = self.node_mask(job)
            model_ok = self.model_mask(job)
            hit = self.cache.put(
                key, (node_ok, model_ok, self.static_check(job, node_ok, model_ok))
            )
        return hit

    def gang_ok(self) -> BoolArray:
        """Nodes whose agent can run a member of a multi-node gang (`runs_gang_members`)."""
        if self._gang_ok is None:
            self._gang_ok = gang_rows(self.ctx.st)
        return self._gang_ok

    def node_mask(
        self, job: JobRequest, *, schedulable_only: bool = True, gangs: bool = True
    ) -> BoolArray:
        st = self.ctx.st
        ok = st.schedulable.copy() if schedulable_only else np.ones(len(st.names), dtype=bool)
        if job.pool is not None:
            ok &= np.array([p == job.pool for p in st.pools], dtype=bool)
        if job.node_selector:
            sel = job.node_selector
            ok &= np.array(
                [all(lb.get(k) == v for k, v in sel.items()) for lb in st.labels], dtype=bool
            )
        if job.node is not None:
            ok &= np.array([name == job.node for name in st.names], dtype=bool)
        if gangs and job.nodes is not None and job.nodes > 1:
            ok &= self.gang_ok()  # single-node jobs run on any node
        return ok

    def model_mask(self, job: JobRequest) -> BoolArray:
        return self.ctx.st.model_mask(
            job.models,
            job.min_gpu_memory_mib,
            job.precisions,
            self.ctx.snap.model_precisions,
            self.model_memory,
        )

    def static_check(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray
    ) -> tuple[PendingReason, str] | None:
        """Why the job can never start on the schedulable nodes as they are, or None. When
        it would fit once nodes that are out of service (draining, cordoned...) return, the
        reason says so and names them: it waits, it is not told it never fits."""
        found = self._static_check(job, node_ok, model_ok)
        if found is not None and job.nodes is not None and job.nodes > 1:
            gang = self._gang_check(job, model_ok)
            if gang is not None:
                return gang
        if found is None or found[0] not in (
            PendingReason.NO_MATCHING_GPU,
            PendingReason.NODE_CONSTRAINTS,
        ):
            return found
        every = self.node_mask(job, schedulable_only=False)
        out = every & ~node_ok
        if not out.any() or self._static_check(job, every, model_ok) is not None:
            return found
        st = self.ctx.st
        fitting = out & (st.gpu_model_ok(model_ok) & st.gpu_valid).any(axis=1)
        nodes = self.ctx.snap.nodes
        named = [
            f"{st.names[i]} {nodes[i].unavailable or 'unavailable'}"
            for i in np.flatnonzero(fitting if fitting.any() else out)
        ]
        more = f" and {len(named) - 5} more" if len(named) > 5 else ""
        pin = f"; {job.node_why}" if job.node is not None and job.node_why else ""
        return PendingReason.NODES_UNAVAILABLE, ", ".join(named[:5]) + more + pin

    def _gang_check(self, job: JobRequest, model_ok: BoolArray) -> tuple[PendingReason, str] | None:
        """A multi-node gang that would fit if the nodes whose agents cannot run gang members
        could: the reason names them and says why (their agents' own words)."""
        st = self.ctx.st
        every = self.node_mask(job, gangs=False)
        cannot = every & ~self.gang_ok()
        if not cannot.any() or self._static_check(job, every, model_ok) is not None:
            return None
        fitting = cannot & (st.gpu_model_ok(model_ok) & st.gpu_valid).any(axis=1)
        rows = np.flatnonzero(fitting if fitting.any() else cannot).tolist()
        named = ", ".join(st.names[i] for i in rows[:5])
        more = f" and {len(rows) - 5} more" if len(rows) > 5 else ""
        why = st.labels[rows[0]].get(GANG_REASON_LABEL, "")
        return PendingReason.NODE_CONSTRAINTS, (
            f"it runs on {job.nodes} nodes, and {named}{more} cannot run a multi-node gang's "
            "members (" + (why or "its agent says so") + ")"
        )

    def _static_check(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray
    ) -> tuple[PendingReason, str] | None:
        st = self.ctx.st
        if not node_ok.any():
            where = f"pool {job.pool!r}" if job.pool else "any pool"
            if job.node is not None:
                return PendingReason.NODE_CONSTRAINTS, (
                    f"it must run on node {job.node} ({job.node_why or 'pinned'}), "
                    f"which is not a schedulable node in {where}"
                )
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
            have = int(per_node.max()) if not self.ctx.cfg.spread_gangs else int(per_node.sum())
            if have < lowest:
                return PendingReason.NO_MATCHING_GPU, (
                    f"it needs {lowest} GPUs ({wanted}), the pool has {have}"
                )
        return None


class PlacementSearch:
    """Finds the GPUs a request would take on a given cluster state, by the pool's scorer."""

    def __init__(self, ctx: PlanningContext, scorer: Scorer) -> None:
        self.ctx = ctx
        self.scorer = scorer
        self.rng = ctx.rng
        self.spread_gangs = ctx.cfg.spread_gangs

    @staticmethod
    def demand(job: JobRequest, gpus: int, model_ok: BoolArray, cpu: int, mem: int) -> Demand:
        milli = job.gpu_milli if gpus > 0 else 0
        return Demand(gpus, milli, job.gpu_memory_mib, cpu, mem, model_ok, ())

    def find(
        self,
        st: ClusterState,
        job: JobRequest,
        node_ok: BoolArray,
        model_ok: BoolArray,
        blocked: BoolArray | None,
        scorer: Scorer | None = None,
        gpus: int | None = None,
    ) -> list[Take] | None:
        scorer = scorer or self.scorer
        total = job.total_gpus if gpus is None else gpus
        if job.nodes is not None and job.gpus_per_node is not None and gpus is None:
            return self._find_gang(st, job, node_ok, model_ok, blocked, scorer)
        d = self.demand(job, total, model_ok, job.cpu_milli, job.memory_mib)
        rows, usable = st.feasible_nodes(d, node_ok, blocked)
        choice = choose_row(scorer, st, d, rows, usable, self.rng)
        if choice is not None:
            row, cols = choice
            return [Take(row, cols, d.milli, d.gpu_memory_mib, d.cpu_milli, d.memory_mib)]
        if total > 1 and not job.is_fraction and self.spread_gangs:
            return self._find_spread(st, job, total, node_ok, model_ok, blocked)
        return None

    def find_elastic(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray, blocked: BoolArray | None
    ) -> list[Take] | None:
        """An elastic job with fewer GPUs, down to its minimum (on the planner's state)."""
        if job.elastic_min is None or job.is_fraction or job.nodes is not None:
            return None
        for k in range(job.total_gpus - 1, max(job.elastic_min, 1) - 1, -1):
            takes = self.find(self.ctx.st, job, node_ok, model_ok, blocked, gpus=k)
            if takes is not None:
                return takes
        return None

    def _find_gang(
        self,
        st: ClusterState,
        job: JobRequest,
        node_ok: BoolArray,
        model_ok: BoolArray,
        blocked: BoolArray | None,
        scorer: Scorer,
    ) -> list[Take] | None:
        assert job.nodes is not None and job.gpus_per_node is not None
        cpu = split(job.cpu_milli, 1, job.nodes)
        mem = split(job.memory_mib, 1, job.nodes)
        d = self.demand(job, job.gpus_per_node, model_ok, cpu, mem)
        remaining = node_ok.copy()
        takes: list[Take] = []
        for _ in range(job.nodes):
            rows, usable = st.feasible_nodes(d, remaining, blocked)
            choice = choose_row(scorer, st, d, rows, usable, self.rng)
            if choice is None:
                return None
            row, cols = choice
            takes.append(Take(row, cols, MILLI, 0, cpu, mem))
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
    ) -> list[Take] | None:
        d = self.demand(job, 1, model_ok, 0, 0)
        usable = st.usable_gpus(d, blocked)
        # spread over several nodes, it runs as a gang: only on nodes that can run its members
        cnt = np.where(node_ok & st.schedulable & gang_rows(st), usable.sum(axis=1), 0)
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
            takes: list[Take] = []
            left = total
            for row in order[cnt_model[order] > 0].tolist():
                k = min(left, int(cnt_model[row]))
                cpu = split(job.cpu_milli, k, total)
                mem = split(job.memory_mib, k, total)
                if st.cpu_free[row] < cpu or st.mem_free[row] < mem:
                    continue
                cols = np.flatnonzero(of_model[row])[:k].tolist()
                takes.append(Take(row, cols, MILLI, 0, cpu, mem))
                left -= k
                if left == 0:
                    return takes
        return None


def gang_rows(st: ClusterState) -> BoolArray:
    """Rows whose node can run a member of a multi-node gang (see `runs_gang_members`)."""
    return np.array([runs_gang_members(lb) for lb in st.labels], dtype=bool)


def shares_of(st: ClusterState, takes: list[Take]) -> tuple[Share, ...]:
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


def take(st: ClusterState, takes: list[Take]) -> None:
    for t in takes:
        st.take(t.row, t.cols, t.milli, t.gpu_mem, t.cpu, t.mem)


def release(st: ClusterState, w: RunningWork, shares: Sequence[Share] | None = None) -> None:
    """Give back running work's shares (all, or those named) and its CPU and memory there."""
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
        st.give_cpu(row, split(w.cpu_milli, k, n), split(w.memory_mib, k, n))


FreeKey = tuple[int, bytes, bytes]


class FreeGpuCount:
    """Matching GPUs free now (a gang waiting for a layout says how many there are)."""

    def __init__(self, ctx: PlanningContext) -> None:
        self.ctx = ctx
        self.cache: EpochCache[FreeKey, int] = EpochCache(ctx.epoch)

    def of(self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray) -> int:
        key = (len(self.ctx.gone), model_ok.tobytes(), node_ok.tobytes())
        free = self.cache.get(key)
        if free is None:
            d = PlacementSearch.demand(job, 1, model_ok, 0, 0)
            free = self.cache.put(key, int((self.ctx.st.usable_gpus(d) & node_ok[:, None]).sum()))
        return free
