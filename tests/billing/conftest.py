"""Billing fixtures: a fleet, a team, and allocations placed at chosen times."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime

import pytest

from scheduler.core.model import billed_share_milli
from scheduler.models import Allocation, Gpu, Job, JobState

_seq = itertools.count(1)


def at(text: str) -> datetime:
    """'2025-03-31 23:30' (or with seconds) as an aware UTC datetime."""
    fmt = "%Y-%m-%d %H:%M:%S" if text.count(":") == 2 else "%Y-%m-%d %H:%M"
    return datetime.strptime(text, fmt).replace(tzinfo=UTC)


@pytest.fixture
def lab(team, fleet):
    return {**team, **fleet}


@pytest.fixture
def place(lab):
    """Create a job and its allocation on a GPU over [start, end) without the scheduler."""

    def make(
        *,
        project=None,
        gpu: Gpu | None = None,
        start: datetime,
        end: datetime | None = None,
        share: int = 1000,
        end_reason: str = "completed",
        preemptible: bool = False,
        borrowed: bool = False,
        checkpoint: str = "",
        job: Job | None = None,
        memory_mib: int = 0,
    ) -> Allocation:
        project = project or lab["a"]
        gpu = gpu or Gpu.objects.filter(model=lab["h100"]).order_by("pk").first()
        if job is None:
            job = Job.objects.create(
                project=project,
                submitted_by=lab["owner"],
                name=f"job-{next(_seq)}",
                command="python train.py",
                gpu_milli=share,
                gpu_model=gpu.model,
                preemptible=preemptible,
                checkpoint=checkpoint,
                state=JobState.RUNNING if end is None else JobState.SUCCEEDED,
            )
        return Allocation.objects.create(
            job=job,
            gpu=gpu,
            node=gpu.node,
            attempt=job.allocations.count() + 1,
            share_milli=share,
            memory_mib=memory_mib,
            # frozen at placement, as the cycle does
            billed_milli=billed_share_milli(share, gpu.capacity_milli, memory_mib, gpu.memory_mib),
            gpu_model=gpu.model,
            borrowed=borrowed,
            started_at=start,
            ended_at=end,
            end_reason=end_reason if end is not None else "",
        )

    return make
