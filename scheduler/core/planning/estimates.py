"""Estimated starts: the expected releases of GPUs in time order, and when a job would fit
if running work ended as estimated."""

from __future__ import annotations

import math
from bisect import insort

from scheduler.core.model import MILLI, JobRequest, RunningWork
from scheduler.core.planning.context import BY_TIME, Event, PlanningContext, Take, end_or_inf
from scheduler.core.planning.search import PlacementSearch, release
from scheduler.core.scorers import FirstFitScorer
from scheduler.core.state import BoolArray, ClusterState


class StartEstimator:
    def __init__(self, ctx: PlanningContext, search: PlacementSearch) -> None:
        self.ctx = ctx
        self.search = search
        self.first_fit = FirstFitScorer()
        self.n_estimates = 0
        # Expected releases in time order, kept sorted as work is placed; see `release_events`.
        self.timeline: list[Event] = sorted(
            ((end_or_inf(w.expected_end(), ctx.now), w.job_id, w) for w in ctx.running),
            key=BY_TIME,
        )

    def release_events(self) -> list[Event]:
        """Expected releases: (time, job id, what), unknown ends last (at +inf).

        Running work (less the victims) and what this cycle placed, in (time, job id) order:
        sorted once, then kept in order as placements and preemptions happen.
        """
        return self.timeline

    def placed(self, job: JobRequest, takes: list[Take]) -> None:
        now = self.ctx.now
        end = None if job.runtime_estimate_s is None else now + job.runtime_estimate_s
        insort(self.timeline, (end_or_inf(end, now), job.job_id, takes), key=BY_TIME)

    def stopped(self, job_ids: set[int]) -> None:
        """Victims release nothing later: they are gone from the timeline."""
        self.timeline = [e for e in self.timeline if e[1] not in job_ids]

    def _release_event(self, st: ClusterState, what: RunningWork | list[Take]) -> None:
        if isinstance(what, list):
            for t in what:
                for c in t.cols:
                    milli = t.milli if t.milli < MILLI else int(st.gpu_cap[t.row, c])
                    st.give(t.row, c, milli, t.gpu_mem)
                st.give_cpu(t.row, t.cpu, t.mem)
        else:
            release(st, what, self.ctx.shrunk.get(what.job_id, what.shares))

    def earliest(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray
    ) -> tuple[float | None, int | None, list[Take] | None]:
        """When the job would fit if running work ended as estimated (unknown ends last).

        Fitting only gets easier as work ends, so gallop over the release events, then
        binary-search the first one after which the job fits: O(log n) placement checks.
        """
        st = self.ctx.st.copy()
        for w in self.ctx.running:
            if w.job_id in self.ctx.gone:
                release(st, w)
        events = self.release_events()

        def fits(state: ClusterState) -> list[Take] | None:
            return self.search.find(state, job, node_ok, model_ok, None, self.first_fit)

        done, step = 0, 1
        while done < len(events):
            upto = min(len(events), done + step)
            lo_state = st.copy()
            for _t, _j, what in events[done:upto]:
                self._release_event(st, what)
            if fits(st) is not None:
                lo, hi = done, upto  # does not fit after `lo` events, fits after `hi`
                while hi - lo > 1:
                    mid = (lo + hi) // 2
                    trial = lo_state.copy()
                    for _t, _j, what in events[lo:mid]:
                        self._release_event(trial, what)
                    if fits(trial) is not None:
                        hi = mid
                    else:
                        lo, lo_state = mid, trial
                final = lo_state
                for _t, _j, what in events[lo:hi]:
                    self._release_event(final, what)
                t_end, jid, _what = events[hi - 1]
                return (None if math.isinf(t_end) else t_end), jid, fits(final)
            done, step = upto, step * 2
        return None, None, None

    def maybe_estimate(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray
    ) -> tuple[float, int | None] | None:
        """An estimated start (and the job whose end allows it), within the cycle's budget."""
        cfg = self.ctx.cfg
        if not cfg.estimate_starts or self.n_estimates >= cfg.max_estimates:
            return None
        self.n_estimates += 1
        t, jid, _ = self.earliest(job, node_ok, model_ok)
        return (t, jid) if t is not None else None
