"""Preemption: the fewest running jobs to stop so that a waiting job fits.

Victims, in order: borrowed work first, then lowest priority, least GPU-time lost. Work that is
neither preemptible nor borrowed is never a victim; work inside its minimum runtime, or that
recently preempted the waiting job, is spared.
"""

from __future__ import annotations

from scheduler.core.model import JobRequest, RunningWork
from scheduler.core.planning.context import PlanningContext
from scheduler.core.planning.decisions import Preemption
from scheduler.core.planning.search import PlacementSearch, release
from scheduler.core.scorers import FirstFitScorer
from scheduler.core.state import BoolArray


class Preemptor:
    def __init__(self, ctx: PlanningContext, search: PlacementSearch) -> None:
        self.ctx = ctx
        self.search = search
        self.first_fit = FirstFitScorer()
        self.preemptions: list[Preemption] = []
        self.attempts = 0  # searches this cycle, capped by `max_preemption_attempts`
        now = ctx.now
        self.victim_order = sorted(
            (w for w in ctx.running if w.preemptible or w.borrowed),
            key=lambda w: (
                0 if w.borrowed else 1,
                w.priority,
                w.gpu_milli_total * max(0.0, now - w.started_at),
                w.job_id,
            ),
        )

    def may_try(self) -> bool:
        return self.ctx.cfg.preemption and self.attempts < self.ctx.cfg.max_preemption_attempts

    def victims_for(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray, borrowed: bool
    ) -> list[RunningWork] | None:
        """The victims whose GPUs let the job fit (none unnecessary), or None."""
        ctx = self.ctx

        def eligible(w: RunningWork) -> bool:
            if w.job_id in ctx.gone or w.job_id in job.preempted_by:
                return False
            if ctx.now - w.started_at < w.min_runtime_s:
                return False  # inside its minimum runtime
            if w.priority < job.priority and (w.preemptible or w.borrowed):
                return True
            # borrowed work is reclaimed by in-quota work of another project, any priority
            return w.borrowed and not borrowed and w.project != job.project

        st = ctx.st.copy()
        chosen: list[RunningWork] = []
        found = False
        for w in self.victim_order:
            if not w.borrowed and w.priority >= job.priority:
                break  # sorted: borrowed work first, then by priority; nothing eligible follows
            if not eligible(w):
                continue
            release(st, w, ctx.shrunk.get(w.job_id, w.shares))
            chosen.append(w)
            if self.search.find(st, job, node_ok, model_ok, None, self.first_fit) is not None:
                found = True
                break
        if not found:
            return None
        # drop victims that turn out unnecessary (latest first)
        for w in list(reversed(chosen[:-1])):
            trial = ctx.st.copy()
            for v in chosen:
                if v is not w:
                    release(trial, v, ctx.shrunk.get(v.job_id, v.shares))
            if self.search.find(trial, job, node_ok, model_ok, None, self.first_fit) is not None:
                chosen.remove(w)
        return chosen

    def preempt(self, job: JobRequest, victims: list[RunningWork]) -> None:
        """Stop the victims for the job: they are gone for the rest of the cycle."""
        for v in victims:
            self.ctx.gone.add(v.job_id)
            why = (
                "reclaiming borrowed capacity"
                if v.borrowed and v.priority >= job.priority
                else f"priority {job.priority} job needs its GPUs (victim priority {v.priority})"
            )
            self.preemptions.append(Preemption(v.job_id, job.job_id, why))
