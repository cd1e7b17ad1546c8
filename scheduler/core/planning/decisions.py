"""The scheduling policy of a pool, and what a plan decides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from scheduler.core.model import Share, TaskShape
from scheduler.core.reasons import PendingReason

QUEUE_POLICIES = ("fcfs", "sjf", "priority", "fairshare")


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
    for_job: int | None = None  # a shrink: the waiting job it makes room for


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
