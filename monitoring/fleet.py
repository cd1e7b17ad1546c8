"""Capacity and fragmentation: free GPUs per model, the largest gang that fits, the ratio.

`fleet_capacity` answers from two queries (GPUs with their node, active shares per GPU) so the
cluster overview stays cheap. The fragmentation ratio is the measure of the scheduler core
(FGD, Weng et al. ATC '23) over the real cluster snapshot and the shapes of queued work; it is
computed on beat and kept as `FleetSnapshot` rows, which make the ratio over time.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import datetime

from django.db import transaction
from django.db.models import Sum

from monitoring import live
from monitoring.models import FleetSnapshot
from scheduler.core.model import MILLI, gpu_capacity_milli, gpu_demand_milli
from scheduler.models import Allocation, Gpu, Job, JobState, Node

log = logging.getLogger(__name__)

SCHEDULABLE = (Node.State.READY,)


@dataclass
class GpuCell:
    gpu_id: int
    index: int
    node_id: int
    node: str
    node_state: str
    model: str
    health: str
    capacity_milli: int
    used_milli: int

    @property
    def schedulable(self) -> bool:
        return self.node_state in SCHEDULABLE and self.health != Gpu.Health.UNHEALTHY

    @property
    def free_whole(self) -> bool:
        return self.schedulable and self.used_milli == 0


@dataclass
class ModelCapacity:
    model: str
    total_gpus: int = 0
    free_gpus: int = 0
    capacity_milli: int = 0
    allocated_milli: int = 0
    largest_node_block: int = 0
    largest_gang: int = 0
    gang_shape: tuple[int, int] = (0, 0)  # nodes × GPUs per node of the largest gang
    free_per_node: dict[int, int] = field(default_factory=dict)

    @property
    def allocated_pct(self) -> float:
        return 100.0 * self.allocated_milli / self.capacity_milli if self.capacity_milli else 0.0


GpuRow = tuple[int, int, int, str, str, str, str, int]  # GpuCell without used_milli
_structure: dict[str, tuple[float, list[GpuRow]]] = {}


def _gpu_rows(max_age_s: float) -> list[GpuRow]:
    """Every GPU of every live node (one query), reused for `max_age_s` in this process."""
    cache_key = live.prefix()
    hit = _structure.get(cache_key)
    if hit is not None and time.monotonic() - hit[0] < max_age_s:
        return hit[1]
    rows = (
        Gpu.objects.exclude(node__state=Node.State.RETIRED)
        .order_by("node__name", "index")
        .values_list(
            "pk",
            "index",
            "node_id",
            "node__name",
            "node__state",
            "model__name",
            "health",
            "sharing_mode",
            "oversubscription",
        )
    )
    out = [
        (
            pk,
            index,
            node_id,
            node,
            state,
            model,
            health,
            gpu_capacity_milli(sharing, over),
        )
        for pk, index, node_id, node, state, model, health, sharing, over in rows
    ]
    if max_age_s > 0:
        _structure.clear()
        _structure[cache_key] = (time.monotonic(), out)
    return out


def held_milli() -> dict[int, int]:
    """Milli-GPU held on each GPU now (one query)."""
    return dict(
        Allocation.objects.filter(ended_at__isnull=True)
        .values("gpu_id")
        .annotate(milli=Sum("share_milli"))
        .values_list("gpu_id", "milli")
    )


def gpu_cells(*, structure_max_age_s: float = 0.0) -> list[GpuCell]:
    """Every GPU of every node still in the fleet, with the milli-GPU held on it (two queries).

    With `structure_max_age_s`, the GPU/node rows (not what is held) may come from this
    process's copy of that age: the overview polls every 2 s and the fleet changes rarely.
    """
    used = held_milli()
    return [
        GpuCell(pk, index, node_id, node, state, model, health, cap, int(used.get(pk, 0)))
        for pk, index, node_id, node, state, model, health, cap in _gpu_rows(structure_max_age_s)
    ]


def largest_gang(free_per_node: dict[int, int]) -> tuple[int, tuple[int, int]]:
    """The most GPUs one gang job (n nodes × k GPUs each) can get now, and its shape."""
    counts = sorted(free_per_node.values(), reverse=True)
    best, shape = 0, (0, 0)
    for n, k in enumerate(counts, start=1):
        if k * n > best:
            best, shape = k * n, (n, k)
    return best, shape


def fleet_capacity(cells: list[GpuCell]) -> dict[str, ModelCapacity]:
    """Per GPU model: totals, free whole GPUs on schedulable nodes, the largest gang."""
    out: dict[str, ModelCapacity] = {}
    for c in cells:
        m = out.setdefault(c.model, ModelCapacity(c.model))
        m.total_gpus += 1
        if c.schedulable:
            m.capacity_milli += c.capacity_milli
            m.allocated_milli += min(c.used_milli, c.capacity_milli)
        if c.free_whole:
            m.free_gpus += 1
            m.free_per_node[c.node_id] = m.free_per_node.get(c.node_id, 0) + 1
    for m in out.values():
        m.largest_node_block = max(m.free_per_node.values(), default=0)
        m.largest_gang, m.gang_shape = largest_gang(m.free_per_node)
    return dict(sorted(out.items()))


def queue_by_model() -> dict[str, dict[str, float]]:
    """Queued jobs per requested model ('any' when none): count and GPUs asked for."""
    out: dict[str, dict[str, float]] = {}
    rows = Job.objects.filter(state=JobState.QUEUED).values_list(
        "gpu_model__name", "gpus", "nodes", "gpus_per_node", "gpu_milli"
    )
    for model, gpus, nodes, per_node, milli in rows:
        entry = out.setdefault(model or "any", {"jobs": 0, "gpus": 0.0})
        entry["jobs"] += 1
        entry["gpus"] += gpu_demand_milli(gpus, nodes, per_node, milli) / MILLI
    return dict(sorted(out.items()))


def frag_ratio_simple(cells: list[GpuCell]) -> float:
    """Fallback measure: percent of idle capacity on nodes that are partly in use."""
    idle: dict[int, int] = defaultdict(int)
    busy: set[int] = set()
    for c in cells:
        if not c.schedulable:
            continue
        idle[c.node_id] += max(0, c.capacity_milli - c.used_milli)
        if c.used_milli:
            busy.add(c.node_id)
    total = sum(idle.values())
    return 100.0 * sum(v for n, v in idle.items() if n in busy) / total if total else 0.0


def frag_ratio_core(*, now: datetime) -> float | None:
    """FGD fragmentation ratio of the scheduler core over the real snapshot, or None if unavailable."""
    try:
        from scheduler.core.model import TaskShape
        from scheduler.core.packing import cluster_frag_ratio
        from scheduler.core.scorers import FragModel
        from scheduler.core.state import ClusterState
        from scheduler.cycle import build_state

        state = build_state(now=now)
        st = ClusterState.from_snapshot(state.snapshot)
        weights: dict[tuple[int, int, int, frozenset[str]], float] = defaultdict(float)
        for req in state.queue:
            per_node = req.gpus_per_node if req.nodes and req.gpus_per_node else req.gpus
            nodes = req.nodes or 1
            weights[(req.cpu_milli // nodes, min(req.gpu_milli, 1000), per_node, req.models)] += 1
        if not weights:  # nothing queued: judge against whole-GPU shapes of 1, 2, 4 and 8
            for k in (1, 2, 4, 8):
                weights[(0, 1000, k, frozenset())] = 1.0
        shapes = [TaskShape(c, m, g, models, w) for (c, m, g, models), w in weights.items()]
        return float(cluster_frag_ratio(st, FragModel(shapes, st.models)))
    except Exception:  # the core is evolving; a monitoring page must not fail with it
        log.exception("fragmentation from scheduler.core failed; using the simple measure")
        return None


@transaction.atomic
def fleet_snapshot_take(*, now: datetime) -> list[FleetSnapshot]:
    """Record capacity and fragmentation for this minute (one row per model and one for all)."""
    at = now.replace(second=0, microsecond=0)
    cells = gpu_cells()
    capacity = fleet_capacity(cells)
    queue = queue_by_model()
    ratio = frag_ratio_core(now=now)
    if ratio is None:
        ratio = frag_ratio_simple(cells)
    all_free: dict[int, int] = defaultdict(int)
    rows = []
    for m in capacity.values():
        by_model = [c for c in cells if c.model == m.model]
        rows.append(
            FleetSnapshot(
                at=at,
                model_name=m.model,
                total_gpus=m.total_gpus,
                free_gpus=m.free_gpus,
                allocated_milli=m.allocated_milli,
                capacity_milli=m.capacity_milli,
                largest_gang=m.largest_gang,
                largest_node_block=m.largest_node_block,
                queued_jobs=int(queue.get(m.model, {}).get("jobs", 0)),
                frag_ratio=frag_ratio_simple(by_model),
            )
        )
        for node_id, free in m.free_per_node.items():
            all_free[node_id] = max(all_free[node_id], free)
    gang, _shape = largest_gang(dict(all_free))
    rows.append(
        FleetSnapshot(
            at=at,
            model_name="",
            total_gpus=sum(m.total_gpus for m in capacity.values()),
            free_gpus=sum(m.free_gpus for m in capacity.values()),
            allocated_milli=sum(m.allocated_milli for m in capacity.values()),
            capacity_milli=sum(m.capacity_milli for m in capacity.values()),
            largest_gang=gang,
            largest_node_block=max(all_free.values(), default=0),
            queued_jobs=int(sum(q["jobs"] for q in queue.values())),
            frag_ratio=ratio,
        )
    )
    FleetSnapshot.objects.filter(at=at).delete()
    return FleetSnapshot.objects.bulk_create(rows)
