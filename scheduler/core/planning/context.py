"""What the planner's collaborators share in one pool's cycle, and its bookkeeping types."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from operator import itemgetter

import numpy as np

from scheduler.core.model import RunningWork, Share, Snapshot
from scheduler.core.planning.caches import StateEpoch
from scheduler.core.planning.decisions import PolicyConfig
from scheduler.core.state import ClusterState


@dataclass(slots=True)
class Take:
    """GPUs taken on one node row: columns, milli per GPU as requested (1000 = whole)."""

    row: int
    cols: list[int]
    milli: int
    gpu_mem: int
    cpu: int
    mem: int


@dataclass(slots=True)
class Usage:
    """Milli-GPU in use per project and per (project, model): what quotas count."""

    total: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    model: dict[tuple[str, str], int] = field(default_factory=lambda: defaultdict(int))


Event = tuple[float, int, RunningWork | list[Take]]
BY_TIME = itemgetter(0, 1)  # release events order by (time, job id)


def end_or_inf(end: float | None, now: float) -> float:
    return max(now, end) if end is not None else math.inf


def split(total: int, part: int, whole: int) -> int:
    return -(-total * part // whole) if whole > 0 else total


@dataclass(slots=True)
class PlanningContext:
    """The state one pool's cycle shares: the working cluster, usage, running work and what
    this cycle did to it (victims, shrinks), and the epoch that invalidates caches."""

    snap: Snapshot
    cfg: PolicyConfig
    now: float
    st: ClusterState
    usage: Usage
    running: list[RunningWork]
    rng: np.random.Generator
    epoch: StateEpoch = field(default_factory=StateEpoch)
    gone: set[int] = field(default_factory=set)  # running jobs chosen as victims
    shrunk: dict[int, list[Share]] = field(default_factory=dict)  # elastic work, shrunk
