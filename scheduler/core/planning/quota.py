"""Quota admission and usage accounting: which GPU models a job may use within its project's
quota (an elastic job may be admitted smaller), which models keep other projects' unused
reservations covered, and the usage that placed work adds."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from scheduler.core.model import MILLI, JobRequest, ProjectQuota, RunningWork
from scheduler.core.planning.caches import EpochCache
from scheduler.core.planning.context import PlanningContext, Take
from scheduler.core.state import BoolArray

QuotaKey = tuple[str, int, int, int | None, int | None, bytes]
QuotaAnswer = tuple[BoolArray, str, int]
ProtectedKey = tuple[str, int]


class QuotaBook:
    def __init__(self, ctx: PlanningContext) -> None:
        self.ctx = ctx
        self.quota_cache: EpochCache[QuotaKey, QuotaAnswer] = EpochCache(ctx.epoch)
        self.protected_cache: EpochCache[ProtectedKey, BoolArray] = EpochCache(ctx.epoch)
        self.any_reserved = any(q.reserved for q in ctx.snap.quotas.values())
        self.all_models = np.ones(len(ctx.st.models), dtype=bool)
        self.all_models.flags.writeable = False

    def quota_models(self, job: JobRequest, model_ok: BoolArray) -> QuotaAnswer:
        """Models the job may use within quota, why not (empty if fine), and how many GPUs
        (an elastic job may be admitted with fewer, down to its minimum)."""
        q = self.ctx.snap.quotas.get(job.project)
        if q is None:
            return model_ok, "", job.total_gpus
        key = (
            job.project,
            job.total_gpus,
            job.gpu_milli,
            job.elastic_min,
            job.nodes,
            model_ok.tobytes(),
        )
        hit = self.quota_cache.get(key)
        if hit is None:
            hit = self.quota_cache.put(key, self._quota_models(job, q, model_ok))
        return hit

    def _quota_models(self, job: JobRequest, q: ProjectQuota, model_ok: BoolArray) -> QuotaAnswer:
        sizes = [job.total_gpus]
        if job.elastic_min is not None and not job.is_fraction and job.nodes is None:
            sizes = list(range(job.total_gpus, max(job.elastic_min, 1) - 1, -1))
        usage = self.ctx.usage
        used = usage.total[job.project]
        why = ""
        for k in sizes:
            need = job.gpu_milli if job.is_fraction else k * MILLI
            if q.max_gpus is not None and used + need > q.max_gpus * MILLI:
                why = (
                    f"{used / MILLI:g} of {q.max_gpus} GPUs in use, this job needs {need / MILLI:g}"
                )
                continue
            ok = model_ok.copy()
            for i, m in enumerate(self.ctx.st.models):
                cap = q.max_gpus_per_model.get(m)
                in_use = usage.model[(job.project, m)]
                if ok[i] and cap is not None and in_use + need > cap * MILLI:
                    ok[i] = False
                    why = f"{in_use / MILLI:g} of {cap} {m} in use, this job needs {need / MILLI:g}"
            if ok.any():
                return ok, "", k
        return np.zeros_like(model_ok), why, job.total_gpus

    def protected_models(self, job: JobRequest, need_gpus: int) -> BoolArray:
        """Models whose idle GPUs, after this job, would still cover other projects' unused
        reservations (only those may be used without borrowing)."""
        if not self.any_reserved:
            return self.all_models
        key = (job.project, need_gpus)
        hit = self.protected_cache.get(key)
        if hit is None:
            hit = self.protected_cache.put(key, self._protected_models(job, need_gpus))
        return hit

    def _protected_models(self, job: JobRequest, need_gpus: int) -> BoolArray:
        st = self.ctx.st
        prot: dict[str, float] = defaultdict(float)
        for proj, q in self.ctx.snap.quotas.items():
            if proj == job.project:
                continue
            for m, n in q.reserved.items():
                prot[m] += max(0.0, n - self.ctx.usage.model[(proj, m)] / MILLI)
        ok = np.ones(len(st.models), dtype=bool)
        if not prot:
            return ok
        idle = (st.gpu_left == st.gpu_cap) & (st.gpu_cap > 0)
        for i, m in enumerate(st.models):
            if prot.get(m, 0.0) > 0:
                free = int((idle & (st.gpu_model == i)).sum())
                ok[i] = free - need_gpus >= prot[m]
        return ok

    def account(self, job: JobRequest, takes: list[Take], borrowed: bool) -> None:
        """Count placed work against its project's quota (borrowed work does not count)."""
        if borrowed:
            return
        st, usage = self.ctx.st, self.ctx.usage
        for t in takes:
            m = st.models[int(st.gpu_model[t.row, t.cols[0]])] if t.cols else ""
            milli = t.milli * len(t.cols)
            usage.total[job.project] += milli
            if m:
                usage.model[(job.project, m)] += milli

    def grow_room(self, w: RunningWork, want: int) -> int:
        """How many of `want` more GPUs the running job's project quota allows."""
        q = self.ctx.snap.quotas.get(w.project)
        if q is not None and q.max_gpus is not None and not w.borrowed:
            room = (q.max_gpus * MILLI - self.ctx.usage.total[w.project]) // MILLI
            want = min(want, int(room))
        return want

    def account_growth(self, w: RunningWork, milli: int) -> None:
        if not w.borrowed:
            self.ctx.usage.total[w.project] += milli
