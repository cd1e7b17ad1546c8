"""Autoscaler decisions as a pure function of what a pool has and what its queue needs."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # provisioning, ready, cordoned, draining, unhealthy
    busy: bool
    idle_for_s: float


@dataclass(frozen=True)
class ScalerInput:
    min_nodes: int
    max_nodes: int
    warm_nodes: int
    gpus_per_node: int
    provisioning_time_s: float
    idle_ttl_s: float
    nodes: tuple[NodeInfo, ...]
    unplaceable_gpus: int  # queued GPUs of this model that fit nowhere now
    frees_in_s: float | None  # when running work is expected to free enough GPUs (None: unknown)


@dataclass(frozen=True)
class Decision:
    action: str  # scale_up, scale_down, hold
    count: int = 0
    remove: tuple[str, ...] = ()
    reason: str = ""


def decide(inp: ScalerInput) -> Decision:
    total = len(inp.nodes)
    provisioning = sum(1 for n in inp.nodes if n.state == "provisioning")
    idle_ready = [n for n in inp.nodes if n.state == "ready" and not n.busy]
    room = max(0, inp.max_nodes - total)

    if total < inp.min_nodes:
        n = inp.min_nodes - total
        return Decision(
            "scale_up", n, reason=f"{total} nodes, below the minimum of {inp.min_nodes}"
        )

    if inp.unplaceable_gpus > 0:
        needed = math.ceil(inp.unplaceable_gpus / inp.gpus_per_node) - provisioning
        waiting_is_faster = inp.frees_in_s is not None and inp.frees_in_s <= inp.provisioning_time_s
        if needed > 0 and not waiting_is_faster:
            if room == 0:
                return Decision(
                    "hold",
                    reason=f"{inp.unplaceable_gpus} queued GPUs do not fit, but the pool is at "
                    f"its maximum of {inp.max_nodes} nodes",
                )
            n = min(needed, room)
            frees = "unknown" if inp.frees_in_s is None else f"{inp.frees_in_s:.0f} s"
            return Decision(
                "scale_up",
                n,
                reason=f"{inp.unplaceable_gpus} queued GPUs do not fit; a node takes "
                f"{inp.provisioning_time_s:.0f} s, running work frees GPUs in {frees}",
            )
        if needed > 0:
            return Decision(
                "hold",
                reason=f"queued work will fit in {inp.frees_in_s:.0f} s, sooner than a new node "
                f"({inp.provisioning_time_s:.0f} s)",
            )

    warm = len(idle_ready) + provisioning
    if warm < inp.warm_nodes and room > 0:
        n = min(inp.warm_nodes - warm, room)
        return Decision("scale_up", n, reason=f"keep a warm pool of {inp.warm_nodes} idle nodes")

    expired = sorted(
        (n for n in idle_ready if n.idle_for_s >= inp.idle_ttl_s),
        key=lambda n: (-n.idle_for_s, n.name),
    )
    removable = min(len(expired), len(idle_ready) - inp.warm_nodes, total - inp.min_nodes)
    if removable > 0 and inp.unplaceable_gpus == 0:
        remove = tuple(n.name for n in expired[:removable])
        return Decision(
            "scale_down",
            len(remove),
            remove=remove,
            reason=f"idle longer than {inp.idle_ttl_s:.0f} s beyond the warm pool of {inp.warm_nodes}",
        )
    return Decision("hold", reason="capacity matches demand")
