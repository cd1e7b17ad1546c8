"""Elastic work: shrunk (down to its minimum) so a waiting job of no lower priority fits, and
grown into GPUs left idle when no job waits for capacity."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import numpy as np

from scheduler.core.model import MILLI, JobRequest, Share
from scheduler.core.planning.context import PlanningContext, Take
from scheduler.core.planning.decisions import Resize
from scheduler.core.planning.quota import QuotaBook
from scheduler.core.planning.search import PlacementSearch, release
from scheduler.core.state import BoolArray


class Elastic:
    def __init__(self, ctx: PlanningContext, search: PlacementSearch, quota: QuotaBook) -> None:
        self.ctx = ctx
        self.search = search
        self.quota = quota
        self.resizes: list[Resize] = []
        self.running = [w for w in ctx.running if w.elastic_min is not None]

    def shrink_for(
        self, job: JobRequest, node_ok: BoolArray, model_ok: BoolArray, blocked: BoolArray | None
    ) -> list[Take] | None:
        """Shrink elastic work (lowest priority first, one GPU at a time) until the job fits;
        the shrinks are made and the job's GPUs returned, or nothing changes and None."""
        ctx = self.ctx
        cands = [
            w
            for w in self.running
            if w.job_id not in ctx.gone
            and w.priority <= job.priority
            and len(ctx.shrunk.get(w.job_id, w.shares)) > (w.elastic_min or 0)
        ]
        if not cands:
            return None
        cands.sort(key=lambda w: (w.priority, w.job_id))
        st = ctx.st.copy()
        released: dict[int, list[Share]] = defaultdict(list)
        for w in cands:
            current = list(ctx.shrunk.get(w.job_id, w.shares))
            min_keep = w.elastic_min or 0
            while len(current) > min_keep:
                s = current.pop()
                released[w.job_id].append(s)
                release(st, replace(w, cpu_milli=0, memory_mib=0), [s])
                takes = self.search.find(st, job, node_ok, model_ok, blocked)
                if takes is not None:
                    for wid, shares in released.items():
                        ww = next(x for x in ctx.running if x.job_id == wid)
                        release(ctx.st, replace(ww, cpu_milli=0, memory_mib=0), shares)
                        keep = [x for x in ctx.shrunk.get(wid, ww.shares) if x not in shares]
                        ctx.shrunk[wid] = keep
                        self.resizes.append(
                            Resize(wid, len(keep), release=tuple(shares), for_job=job.job_id)
                        )
                    ctx.epoch.bump()
                    takes = self.search.find(ctx.st, job, node_ok, model_ok, blocked)
                    assert takes is not None
                    return takes
        return None

    def grow(self) -> None:
        """Give running elastic work idle GPUs of its models, up to its maximum and quota."""
        ctx = self.ctx
        st = ctx.st
        for w in sorted(ctx.running, key=lambda x: (-x.priority, x.job_id)):
            if w.elastic_max is None or w.job_id in ctx.gone:
                continue
            shares = list(ctx.shrunk.get(w.job_id, w.shares))
            want = w.elastic_max - len(shares)
            if want <= 0 or not shares:
                continue
            want = self.quota.grow_room(w, want)
            locs = [st.loc_of_gpu(s.gpu_id) for s in shares]
            models = {int(st.gpu_model[loc]) for loc in locs if loc is not None}
            rows = list(dict.fromkeys(loc[0] for loc in locs if loc is not None))
            idle = (st.gpu_left == st.gpu_cap) & (st.gpu_cap > 0) & st.schedulable[:, None]
            idle &= np.isin(st.gpu_model, list(models))
            other = [r for r in np.flatnonzero(idle.any(axis=1)).tolist() if r not in rows]
            added: list[Share] = []
            for row in rows + other:
                for c in np.flatnonzero(idle[row]).tolist():
                    if len(added) >= want:
                        break
                    added.append(
                        Share(
                            int(st.node_ids[row]),
                            int(st.gpu_ids[row, c]),
                            int(st.gpu_cap[row, c]),
                            int(st.gpu_mem_left[row, c]),
                        )
                    )
                    st.take(row, [c], MILLI, 0, 0, 0)
                    idle[row, c] = False
            if added:
                self.quota.account_growth(w, sum(s.milli for s in added))
                self.resizes.append(Resize(w.job_id, len(shares) + len(added), add=tuple(added)))
