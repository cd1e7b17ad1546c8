"""Immutable values the scheduler decides against.

Units: GPU shares in milli-GPU (1000 = one whole GPU), memory in MiB, CPU in milli-cores,
time in seconds (POSIX timestamps for instants). Mappings default to empty dicts; treat every
value as read-only.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

MILLI = 1000
SHARING_MODES = frozenset({"exclusive", "time_slice", "mps", "mig"})
# Sharing modes that accept fractional (milli-GPU) shares; exclusive and MIG devices are
# handed out whole (a MIG instance is reported as its own GpuView).
FRACTIONAL_SHARING = frozenset({"time_slice", "mps"})
# A node's reserved labels, recorded from its agent's registration: "no" under GANG_LABEL when
# its agent cannot run a member of a multi-node gang (its containers' network fence is not in
# place), why under GANG_REASON_LABEL. No label (an agent from before it said): it can.
GANG_LABEL = "gang.members"
GANG_REASON_LABEL = "gang.members.reason"


def runs_gang_members(labels: Mapping[str, str]) -> bool:
    """Whether a node with these labels may take a member of a multi-node gang."""
    return labels.get(GANG_LABEL) != "no"


_EMPTY: Mapping[str, str] = MappingProxyType({})


def _empty_str_map() -> Mapping[str, str]:
    return _EMPTY


def _empty_int_map() -> Mapping[str, int]:
    return MappingProxyType({})


# ---- rules stated once (Django models, billing and monitoring call these) ----------------


def gpus_requested(gpus: int, nodes: int | None, gpus_per_node: int | None) -> int:
    """Devices a job asks for: nodes × GPUs per node for a fixed layout, else `gpus` (a
    fraction of a GPU asks for one device)."""
    if nodes and gpus_per_node:
        return nodes * gpus_per_node
    return gpus


def gpu_demand_milli(
    gpus: int, nodes: int | None, gpus_per_node: int | None, gpu_milli: int
) -> int:
    """GPU demand in milli-GPU: the devices asked for × the share of each (what quotas count)."""
    return gpus_requested(gpus, nodes, gpus_per_node) * gpu_milli


def planned_runtime_s(estimate_s: int | None, time_limit_s: int | None) -> int | None:
    """How long the planner assumes a job runs: its estimate, never past its time limit (the
    runtime stops it there), or the limit alone when it gave no estimate. None: unknown.

    The ETA, shortest-job-first and backfill all read this one figure."""
    if time_limit_s is None:
        return estimate_s
    if estimate_s is None:
        return time_limit_s
    return min(estimate_s, time_limit_s)


def memory_gb_as_mib(gb: int) -> int:
    """Marketed GB (10⁹ bytes) in MiB, rounded down: how the catalog's and a request's GB
    compare with the MiB devices report."""
    return gb * 1000 * 1000 * 1000 // (1024 * 1024)


def model_may_take(
    *,
    named: Collection[str],
    min_memory_mib: int,
    precisions: Collection[str],
    model: str,
    memory_mib: int,
    model_precisions: Collection[str],
) -> bool:
    """Whether a job may land on GPUs of `model`: one of the models it names (any when it
    names none), with at least the memory it asks for and every precision it asks for. The
    planner's model mask, the catalog's candidates (admission, quotes, the hard-cap check)
    all ask this one question."""
    if named and model not in named:
        return False
    if memory_mib < min_memory_mib:
        return False
    return all(p in model_precisions for p in precisions)


def gpu_capacity_milli(sharing: str, oversubscription: int) -> int:
    """What a device holds in milli-GPU: 1000 when exclusive, 1000 × the factor when shared."""
    return MILLI if sharing == "exclusive" else MILLI * oversubscription


def device_share_milli(share_milli: int, capacity_milli: int) -> int:
    """The part of one whole GPU a share holds: on a time-sliced device (capacity 2000 for ×2)
    a share counts as share/2, so the shares on one device never exceed one GPU. Rounded down
    (in the customer's favour). What quotas count as GPU-hours; billing bills the larger of
    this and the memory part (`billed_share_milli`)."""
    if share_milli < 1 or capacity_milli < MILLI:
        raise ValueError("A share is at least 1 milli-GPU on a device of at least 1000.")
    return min(MILLI, share_milli * MILLI // capacity_milli)


# The least part of a GPU a share is billed as (1 %): a share holds a context and memory on the
# device however small its compute share, so no share bills nothing.
MIN_BILLED_MILLI = 10


def billed_share_milli(
    share_milli: int, capacity_milli: int, memory_mib: int = 0, device_memory_mib: int = 0
) -> int:
    """What a share bills, in milli-GPU of one whole GPU: the larger of its compute part
    (`device_share_milli`) and its memory part (the device memory it holds, rounded down),
    never less than `MIN_BILLED_MILLI` nor more than one GPU. Frozen on the allocation at
    placement (`Allocation.billed_milli`); quotes use the same rule."""
    compute = device_share_milli(share_milli, capacity_milli)
    memory = 0
    if device_memory_mib > 0 and memory_mib > 0:
        memory = min(MILLI, memory_mib * MILLI // device_memory_mib)
    return min(MILLI, max(MIN_BILLED_MILLI, compute, memory))


@dataclass(frozen=True, slots=True)
class GpuView:
    """One GPU device as the scheduler sees it."""

    gpu_id: int
    index: int
    model: str
    memory_mib: int
    capacity_milli: int  # 1000 × oversubscription factor
    used_milli: int
    used_memory_mib: int
    sharing: str = "exclusive"
    healthy: bool = True

    @property
    def free_milli(self) -> int:
        return max(0, self.capacity_milli - self.used_milli)

    @property
    def free_memory_mib(self) -> int:
        return max(0, self.memory_mib - self.used_memory_mib)


@dataclass(frozen=True, slots=True)
class NodeView:
    """A host: its GPUs and what is left of its CPU and memory."""

    node_id: int
    name: str
    pool: str
    gpus: tuple[GpuView, ...]
    cpu_milli_free: int
    memory_mib_free: int
    labels: Mapping[str, str] = field(default_factory=_empty_str_map)
    schedulable: bool = True
    # Why an unschedulable node takes no work, in words ("draining", "cordoned", ...): a job
    # whose only fitting GPUs are there waits for them instead of being told it never fits.
    unavailable: str = ""


@dataclass(frozen=True, slots=True)
class Share:
    """A slice of one GPU held by a job."""

    node_id: int
    gpu_id: int
    milli: int
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class RunningWork:
    """A job that currently holds GPU shares.

    `cpu_milli` and `memory_mib` are the job's totals, held on its nodes in proportion to its
    GPUs there (released when it is preempted or shrunk). `borrowed` marks over-quota or
    reserved-capacity borrowing: such work may be reclaimed regardless of priority.
    """

    job_id: int
    project: str
    priority: int
    preemptible: bool
    started_at: float
    min_runtime_s: int
    runtime_estimate_s: int | None
    shares: tuple[Share, ...]
    elastic_min: int | None = None
    elastic_max: int | None = None
    borrowed: bool = False
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def gpu_count(self) -> int:
        return len({(s.node_id, s.gpu_id) for s in self.shares})

    @property
    def gpu_milli_total(self) -> int:
        return sum(s.milli for s in self.shares)

    def expected_end(self) -> float | None:
        if self.runtime_estimate_s is None:
            return None
        return self.started_at + self.runtime_estimate_s


@dataclass(frozen=True, slots=True)
class JobRequest:
    """What a user asked for.

    - Whole GPUs: ``gpus >= 1`` and ``gpu_milli == 1000``.
    - A fraction of one GPU: ``gpus == 1`` and ``gpu_milli < 1000``, with ``gpu_memory_mib`` as
      the GPU memory limit of the fraction.
    - Gang on a fixed layout: ``nodes`` × ``gpus_per_node`` (``gpus`` is then ignored).
    - Otherwise ``gpus`` whole GPUs on one node if possible, else spread over as many nodes as
      needed (all or nothing).
    - ``cpu_milli``/``memory_mib`` are totals, split across nodes in proportion to GPUs.
    - ``elastic_min``/``elastic_max``: the job may start with fewer GPUs (down to min) and grow
      to max when GPUs are idle.
    - ``preempted_by``: jobs that recently preempted this one; it is never placed by
      preempting them (no preemption loops).
    - ``node``: the one node the job may run on (its node-local volume or checkpoint lives
      there), with ``node_why`` saying so in the pending reason ("its volume 'ckpt' is there").
    """

    job_id: int
    project: str
    submitted_at: float
    gpus: int = 1
    gpu_milli: int = MILLI
    gpu_memory_mib: int = 0
    nodes: int | None = None
    gpus_per_node: int | None = None
    models: frozenset[str] = frozenset()
    min_gpu_memory_mib: int = 0
    precisions: frozenset[str] = frozenset()
    cpu_milli: int = 0
    memory_mib: int = 0
    priority: int = 0
    preemptible: bool = False
    runtime_estimate_s: int | None = None
    elastic_min: int | None = None
    elastic_max: int | None = None
    pool: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=_empty_str_map)
    preempted_by: frozenset[int] = frozenset()
    node: str | None = None
    node_why: str = ""

    @property
    def is_fraction(self) -> bool:
        return self.gpu_milli < MILLI

    @property
    def total_gpus(self) -> int:
        return gpus_requested(self.gpus, self.nodes, self.gpus_per_node)

    @property
    def gpu_milli_total(self) -> int:
        """GPU demand in milli-GPU (what quotas count)."""
        return gpu_demand_milli(self.gpus, self.nodes, self.gpus_per_node, self.gpu_milli)


@dataclass(frozen=True, slots=True)
class ProjectQuota:
    """Per-project limits. ``None`` means unlimited; GPUs are counted in whole-GPU units
    (a fraction counts as its share)."""

    max_gpus: int | None = None
    max_gpus_per_model: Mapping[str, int] = field(default_factory=_empty_int_map)
    allow_borrowing: bool = False
    budget_exhausted: bool = False
    budget_capped: bool = False  # at a hard cap: only preemptible work may start
    reserved: Mapping[str, int] = field(default_factory=_empty_int_map)
    weight: float = 1.0
    decayed_usage: float = 0.0  # GPU-hours, decayed; used by fair share


@dataclass(frozen=True, slots=True)
class TaskShape:
    """A typical task shape with its popularity (for fragmentation-aware scorers)."""

    cpu_milli: int
    gpu_milli: int  # per GPU; 0 for CPU-only tasks
    gpus: int
    models: frozenset[str] = frozenset()
    weight: float = 1.0


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything `plan` needs to know about the cluster at one instant."""

    nodes: tuple[NodeView, ...]
    running: tuple[RunningWork, ...] = ()
    quotas: Mapping[str, ProjectQuota] = field(default_factory=lambda: MappingProxyType({}))
    model_precisions: Mapping[str, frozenset[str]] = field(
        default_factory=lambda: MappingProxyType({})
    )
