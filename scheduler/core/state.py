"""Mutable, array-backed working copy of the cluster used while planning and simulating.

Per-node arithmetic is vectorised with numpy: every scorer evaluates all feasible nodes of a
request in a handful of array operations. Each node carries a version counter that changes
whenever its free resources change, so scorers can cache per-node values safely.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from scheduler.core.model import FRACTIONAL_SHARING, MILLI, Snapshot, model_may_take

IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
FloatArray = npt.NDArray[np.float64]


def affinity_tag(gpus: int, gpu_milli: int) -> str:
    """Shape class used by GPU clustering: no-gpu, share-gpu, or '<n>-gpu'."""
    if gpus <= 0 or gpu_milli <= 0:
        return "no-gpu"
    if gpus == 1 and gpu_milli < MILLI:
        return "share-gpu"
    return f"{gpus}-gpu"


@dataclass(frozen=True, slots=True)
class Demand:
    """A request for one node: `gpus` GPUs of `milli` each (milli < 1000 only with gpus == 1)."""

    gpus: int
    milli: int
    gpu_memory_mib: int
    cpu_milli: int
    memory_mib: int
    model_ok: BoolArray  # over ClusterState.models
    key: tuple[object, ...] = ()

    @property
    def is_fraction(self) -> bool:
        return self.gpus == 1 and 0 < self.milli < MILLI

    @property
    def total_milli(self) -> int:
        return self.gpus * self.milli

    @property
    def tag(self) -> str:
        return affinity_tag(self.gpus, self.milli)


@dataclass
class ClusterState:
    """The planner's working copy of a snapshot as arrays (nodes × GPUs), updated in place as
    it places, preempts and releases work. The Django side's per-cycle input is `CycleInput`."""

    node_ids: IntArray
    names: list[str]
    pools: list[str]
    labels: list[Mapping[str, str]]
    schedulable: BoolArray
    cpu_free: IntArray
    mem_free: IntArray
    gpu_ids: IntArray  # (N, G), -1 where a node has fewer than G GPUs
    gpu_index: IntArray
    gpu_valid: BoolArray  # exists and healthy
    gpu_cap: IntArray  # capacity in milli (0 where invalid)
    gpu_left: IntArray  # free milli (0 where invalid)
    gpu_mem: IntArray
    gpu_mem_left: IntArray
    gpu_model: IntArray  # index into models, -1 where invalid
    gpu_share_ok: BoolArray
    models: list[str]
    affinity: list[Counter[str]]
    version: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    cache: dict[str, object] = field(default_factory=dict)
    # Tie-break order among equally scored nodes (lower first); None: uniformly at random.
    tie_rank: IntArray | None = None
    _row_of_node: dict[int, int] = field(default_factory=dict)
    _col_of_gpu: dict[int, tuple[int, int]] = field(default_factory=dict)

    _affinity_shared: bool = False
    # Rows whose Counter this state owns once it stopped sharing its list (None: all rows).
    _affinity_owned: set[int] | None = None

    def __post_init__(self) -> None:
        if self.version.shape[0] != self.n_nodes:
            self.version = np.zeros(self.n_nodes, dtype=np.int64)
        if self._row_of_node and len(self._row_of_node) == self.n_nodes:
            return  # a copy: the layout indexes are shared
        self.reindex()

    def reindex(self) -> None:
        self._row_of_node = {int(n): i for i, n in enumerate(self.node_ids)}
        self._col_of_gpu = {}
        rows, cols = np.nonzero(self.gpu_ids >= 0)
        for r, c in zip(rows.tolist(), cols.tolist(), strict=True):
            self._col_of_gpu[int(self.gpu_ids[r, c])] = (r, c)

    # ---------------------------------------------------------------- construction
    @property
    def n_nodes(self) -> int:
        return int(self.node_ids.shape[0])

    @property
    def width(self) -> int:
        return int(self.gpu_ids.shape[1])

    @classmethod
    def empty(cls, n: int, g: int) -> ClusterState:
        z = np.zeros((n, g), dtype=np.int64)
        return cls(
            node_ids=np.arange(n, dtype=np.int64),
            names=[""] * n,
            pools=[""] * n,
            labels=[{} for _ in range(n)],
            schedulable=np.ones(n, dtype=np.bool_),
            cpu_free=np.zeros(n, dtype=np.int64),
            mem_free=np.zeros(n, dtype=np.int64),
            gpu_ids=z - 1,
            gpu_index=z.copy(),
            gpu_valid=np.zeros((n, g), dtype=np.bool_),
            gpu_cap=z.copy(),
            gpu_left=z.copy(),
            gpu_mem=z.copy(),
            gpu_mem_left=z.copy(),
            gpu_model=z - 1,
            gpu_share_ok=np.zeros((n, g), dtype=np.bool_),
            models=[],
            affinity=[Counter() for _ in range(n)],
        )

    @classmethod
    def from_snapshot(cls, snap: Snapshot) -> ClusterState:
        n = len(snap.nodes)
        g = max([len(nd.gpus) for nd in snap.nodes] + [1])
        models = sorted({gv.model for nd in snap.nodes for gv in nd.gpus})
        midx = {m: i for i, m in enumerate(models)}
        st = cls.empty(n, g)
        st.models = models
        # one Python pass collecting flat columns, then whole-array assignments
        rows: list[int] = []
        cols: list[int] = []
        per_gpu: list[tuple[int, int, int, int, bool, int, int, int, bool]] = []
        for r, nd in enumerate(snap.nodes):
            st.names[r] = nd.name
            st.pools[r] = nd.pool
            st.labels[r] = nd.labels
            for c, gv in enumerate(sorted(nd.gpus, key=lambda x: x.index)):
                rows.append(r)
                cols.append(c)
                healthy = gv.healthy
                per_gpu.append(
                    (
                        gv.gpu_id,
                        gv.index,
                        midx[gv.model],
                        gv.memory_mib,
                        healthy,
                        gv.capacity_milli if healthy else 0,
                        gv.free_milli if healthy else 0,
                        gv.free_memory_mib if healthy else 0,
                        healthy and gv.sharing in FRACTIONAL_SHARING,
                    )
                )
        st.node_ids[:] = [nd.node_id for nd in snap.nodes]
        st.schedulable[:] = [nd.schedulable for nd in snap.nodes]
        st.cpu_free[:] = [nd.cpu_milli_free for nd in snap.nodes]
        st.mem_free[:] = [nd.memory_mib_free for nd in snap.nodes]
        if per_gpu:
            at = (np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64))
            ids, index, model, mem, valid, cap, left, mem_left, share = zip(*per_gpu, strict=True)
            st.gpu_ids[at] = ids
            st.gpu_index[at] = index
            st.gpu_model[at] = model
            st.gpu_mem[at] = mem
            st.gpu_valid[at] = valid
            st.gpu_cap[at] = cap
            st.gpu_left[at] = left
            st.gpu_mem_left[at] = mem_left
            st.gpu_share_ok[at] = share
        st.reindex()
        by_row: dict[int, list[tuple[int, int]]] = {}
        for w in snap.running:
            per_row: Counter[int] = Counter()
            for s in w.shares:
                loc = st._col_of_gpu.get(s.gpu_id)
                if loc is not None:
                    per_row[loc[0]] += 1
            milli = max((s.milli for s in w.shares), default=0)
            for row, cnt in per_row.items():
                by_row.setdefault(row, []).append((cnt, milli))
        for row, items in by_row.items():
            for cnt, milli in items:
                st.affinity[row][affinity_tag(cnt, min(milli, MILLI))] += 1
        return st

    def copy(self) -> ClusterState:
        st = ClusterState(
            node_ids=self.node_ids,
            names=self.names,
            pools=self.pools,
            labels=self.labels,
            schedulable=self.schedulable,
            cpu_free=self.cpu_free.copy(),
            mem_free=self.mem_free.copy(),
            gpu_ids=self.gpu_ids,
            gpu_index=self.gpu_index,
            gpu_valid=self.gpu_valid,
            gpu_cap=self.gpu_cap,
            gpu_left=self.gpu_left.copy(),
            gpu_mem=self.gpu_mem,
            gpu_mem_left=self.gpu_mem_left.copy(),
            gpu_model=self.gpu_model,
            gpu_share_ok=self.gpu_share_ok,
            models=self.models,
            affinity=self.affinity,  # copied on first write
            version=self.version.copy(),
            _row_of_node=self._row_of_node,
            _col_of_gpu=self._col_of_gpu,
        )
        st._affinity_shared = True
        self._affinity_shared = True
        st.tie_rank = self.tie_rank
        return st

    def _own_affinity(self, row: int) -> None:
        """Copy on write, per row: a copy shares the Counters until one of them changes."""
        if self._affinity_shared:
            self.affinity = list(self.affinity)
            self._affinity_shared = False
            self._affinity_owned = set()
        if self._affinity_owned is not None and row not in self._affinity_owned:
            self.affinity[row] = Counter(self.affinity[row])
            self._affinity_owned.add(row)

    # ---------------------------------------------------------------- lookups
    def row_of(self, node_id: int) -> int:
        return self._row_of_node[node_id]

    def loc_of_gpu(self, gpu_id: int) -> tuple[int, int] | None:
        return self._col_of_gpu.get(gpu_id)

    def model_mask(
        self,
        models: frozenset[str],
        min_memory_mib: int,
        precisions: frozenset[str],
        model_precisions: Mapping[str, frozenset[str]],
        model_memory: Mapping[str, int] | None = None,
    ) -> BoolArray:
        out = np.zeros(len(self.models), dtype=np.bool_)
        for i, m in enumerate(self.models):
            out[i] = model_may_take(
                named=models,
                # without the models' memory, memory is not asked about
                min_memory_mib=min_memory_mib if model_memory is not None else 0,
                precisions=precisions,
                model=m,
                memory_mib=model_memory.get(m, 0) if model_memory is not None else 0,
                model_precisions=model_precisions.get(m, frozenset()),
            )
        return out

    def model_memory(self) -> dict[str, int]:
        """The largest memory of each model's GPUs (one array pass per model, not per GPU)."""
        mem: dict[str, int] = {}
        for i, m in enumerate(self.models):
            of_model = self.gpu_model == i
            if of_model.any():
                mem[m] = max(0, int(self.gpu_mem[of_model].max()))
        return mem

    def gpu_model_ok(self, model_ok: BoolArray) -> BoolArray:
        if model_ok.shape[0] == 0:
            return np.zeros(self.gpu_model.shape, dtype=np.bool_)
        ok: BoolArray = model_ok[np.maximum(self.gpu_model, 0)] & self.gpu_valid
        return ok

    # ---------------------------------------------------------------- feasibility
    def usable_gpus(self, d: Demand, blocked: BoolArray | None = None) -> BoolArray:
        """(N, G) mask of GPUs that could take one unit of `d` right now."""
        ok = self.gpu_model_ok(d.model_ok)
        if d.is_fraction:
            ok &= self.gpu_share_ok & (self.gpu_left >= d.milli)
            ok &= self.gpu_mem_left >= d.gpu_memory_mib
        else:
            ok &= (self.gpu_left == self.gpu_cap) & (self.gpu_cap > 0)
        if blocked is not None:
            ok &= ~blocked
        return ok

    def feasible_nodes(
        self,
        d: Demand,
        node_ok: BoolArray,
        blocked: BoolArray | None = None,
    ) -> tuple[IntArray, BoolArray]:
        """Rows that can host `d` entirely, and the (N, G) usable-GPU mask."""
        base = node_ok & self.schedulable & (self.cpu_free >= d.cpu_milli)
        base &= self.mem_free >= d.memory_mib
        if d.gpus <= 0:
            return np.flatnonzero(base).astype(np.int64), np.zeros(
                self.gpu_left.shape, dtype=np.bool_
            )
        usable = self.usable_gpus(d, blocked)
        cnt = usable.sum(axis=1)
        rows = np.flatnonzero(base & (cnt >= d.gpus)).astype(np.int64)
        return rows, usable

    # ---------------------------------------------------------------- mutation
    def take(
        self, row: int, cols: Sequence[int], milli: int, gpu_mem: int, cpu: int, mem: int
    ) -> None:
        """Allocate `milli` on each GPU column of `row` (whole GPUs: milli = capacity)."""
        for c in cols:
            m = milli if milli < MILLI else int(self.gpu_cap[row, c])
            gm = gpu_mem if milli < MILLI else int(self.gpu_mem_left[row, c])
            self.gpu_left[row, c] -= m
            self.gpu_mem_left[row, c] -= gm
        self.cpu_free[row] -= cpu
        self.mem_free[row] -= mem
        self._own_affinity(row)
        self.affinity[row][affinity_tag(len(cols), milli)] += 1
        self.version[row] += 1

    def give(
        self,
        row: int,
        col: int,
        milli: int,
        gpu_mem: int,
    ) -> None:
        self.gpu_left[row, col] = min(
            int(self.gpu_cap[row, col]), int(self.gpu_left[row, col]) + milli
        )
        self.gpu_mem_left[row, col] = min(
            int(self.gpu_mem[row, col]), int(self.gpu_mem_left[row, col]) + gpu_mem
        )
        self.version[row] += 1

    def give_cpu(self, row: int, cpu: int, mem: int) -> None:
        self.cpu_free[row] += cpu
        self.mem_free[row] += mem
        self.version[row] += 1

    def drop_affinity(self, row: int, tag: str) -> None:
        self._own_affinity(row)
        a = self.affinity[row]
        if a.get(tag, 0) > 0:
            a[tag] -= 1
            if a[tag] <= 0:
                del a[tag]
