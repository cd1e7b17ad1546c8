"""Builders for scheduler.core unit tests (plain functions, no database)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from scheduler.core.model import (
    GpuView,
    JobRequest,
    NodeView,
    ProjectQuota,
    RunningWork,
    Share,
    Snapshot,
)

PRECISIONS = {
    "H100": frozenset({"fp32", "tf32", "bf16", "fp16", "fp8"}),
    "A100": frozenset({"fp32", "tf32", "bf16", "fp16"}),
    "T4": frozenset({"fp32", "fp16", "int8"}),
}
MEMORY = {"H100": 81_920, "A100": 40_960, "T4": 15_360}


def node(
    node_id: int,
    gpus: int = 8,
    model: str = "A100",
    *,
    pool: str = "default",
    cpu: int = 64_000,
    mem: int = 512_000,
    sharing: str = "time_slice",
    capacity: int = 1000,
    used: Sequence[int] = (),
    labels: Mapping[str, str] | None = None,
) -> NodeView:
    return NodeView(
        node_id=node_id,
        name=f"n{node_id}",
        pool=pool,
        gpus=tuple(
            GpuView(
                gpu_id=node_id * 100 + i,
                index=i,
                model=model,
                memory_mib=MEMORY.get(model, 16_000),
                capacity_milli=capacity,
                used_milli=used[i] if i < len(used) else 0,
                used_memory_mib=0,
                sharing=sharing,
            )
            for i in range(gpus)
        ),
        cpu_milli_free=cpu,
        memory_mib_free=mem,
        labels=labels or {},
    )


def job(job_id: int, **kw: object) -> JobRequest:
    kw.setdefault("project", "alpha")
    kw.setdefault("submitted_at", float(job_id))
    return JobRequest(job_id=job_id, **kw)  # type: ignore[arg-type]


def running(
    job_id: int,
    gpu_ids: Sequence[int],
    *,
    project: str = "beta",
    priority: int = 0,
    preemptible: bool = True,
    started_at: float = 0.0,
    min_runtime_s: int = 0,
    estimate: int | None = 3600,
    milli: int = 1000,
    borrowed: bool = False,
    elastic_min: int | None = None,
    elastic_max: int | None = None,
) -> RunningWork:
    return RunningWork(
        job_id=job_id,
        project=project,
        priority=priority,
        preemptible=preemptible,
        started_at=started_at,
        min_runtime_s=min_runtime_s,
        runtime_estimate_s=estimate,
        shares=tuple(Share(g // 100, g, milli) for g in gpu_ids),
        borrowed=borrowed,
        elastic_min=elastic_min,
        elastic_max=elastic_max,
    )


def occupy(nodes: Sequence[NodeView], work: Sequence[RunningWork]) -> tuple[NodeView, ...]:
    """Mark the GPUs held by `work` as used in the node views."""
    held: dict[int, int] = {}
    for w in work:
        for s in w.shares:
            held[s.gpu_id] = held.get(s.gpu_id, 0) + s.milli
    out = []
    for n in nodes:
        gpus = tuple(
            GpuView(
                g.gpu_id,
                g.index,
                g.model,
                g.memory_mib,
                g.capacity_milli,
                g.used_milli + held.get(g.gpu_id, 0),
                g.used_memory_mib,
                g.sharing,
                g.healthy,
            )
            for g in n.gpus
        )
        out.append(replace(n, gpus=gpus))
    return tuple(out)


def snapshot(
    nodes: Sequence[NodeView],
    work: Sequence[RunningWork] = (),
    quotas: Mapping[str, ProjectQuota] | None = None,
) -> Snapshot:
    return Snapshot(
        nodes=occupy(nodes, work),
        running=tuple(work),
        quotas=quotas or {},
        model_precisions=PRECISIONS,
    )
