"""The head job's reservation and EASY backfill: the first job blocked for capacity gets the
GPUs it will start on held, and later jobs use them only if they end before it starts."""

from __future__ import annotations

import numpy as np

from scheduler.core.model import JobRequest
from scheduler.core.planning.context import PlanningContext, Take
from scheduler.core.planning.decisions import Reservation
from scheduler.core.planning.search import shares_of
from scheduler.core.state import BoolArray


class Backfill:
    def __init__(self, ctx: PlanningContext) -> None:
        self.ctx = ctx
        self.reservations: list[Reservation] = []
        self.reserved_mask: BoolArray | None = None
        self.reserve_until: float | None = None
        self.reserve_for: int | None = None  # the first job blocked for capacity
        self.capacity_blocked = False

    def block_for(self, job: JobRequest) -> BoolArray | None:
        """The GPUs this job may not take: the head job's, unless it ends before that starts."""
        if self.reserved_mask is None:
            return None
        if (
            self.reserve_until is not None
            and job.runtime_estimate_s is not None
            and self.ctx.now + job.runtime_estimate_s <= self.reserve_until
        ):
            return None  # ends before the head job can start: does not delay it
        return self.reserved_mask

    def first_blocked(self, job: JobRequest) -> bool:
        """Record a job blocked for capacity; True for the first one (the head job)."""
        first = not self.capacity_blocked
        self.capacity_blocked = True
        if first:
            self.reserve_for = job.job_id
        return first

    def reserve(self, job: JobRequest, start_at: float | None, takes: list[Take]) -> None:
        """Hold the GPUs the head job would start on."""
        st = self.ctx.st
        mask = np.zeros(st.gpu_left.shape, dtype=bool)
        for tk in takes:
            mask[tk.row, tk.cols] = True
        self.reserved_mask = mask
        self.reserve_until = start_at
        self.reservations.append(
            Reservation(job.job_id, shares_of(st, takes), start_at, "backfill")
        )
