"""The pure scheduling core: snapshot in, plan out.

Standard library and numpy only. Django snapshots the database into these values
(`scheduler.core.model`), calls :func:`plan`, and applies the returned :class:`Plan`.
The same code drives the trace simulators in `scheduler.core.packing` and
`scheduler.core.queueing`, so what is benchmarked is what runs.
"""

from scheduler.core.model import (
    GpuView,
    JobRequest,
    NodeView,
    ProjectQuota,
    RunningWork,
    Share,
    Snapshot,
    TaskShape,
)
from scheduler.core.plan import (
    Pending,
    Placement,
    Plan,
    PolicyConfig,
    Preemption,
    Reservation,
    Resize,
    plan,
)
from scheduler.core.reasons import PendingReason
from scheduler.core.scorers import SCORER_NAMES

__all__ = [
    "SCORER_NAMES",
    "GpuView",
    "JobRequest",
    "NodeView",
    "Pending",
    "PendingReason",
    "Placement",
    "Plan",
    "PolicyConfig",
    "Preemption",
    "ProjectQuota",
    "Reservation",
    "Resize",
    "RunningWork",
    "Share",
    "Snapshot",
    "TaskShape",
    "plan",
]
