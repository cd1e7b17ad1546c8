"""Discrete-event replay of job arrivals and durations, driving the same `plan` as production.

At every arrival or completion the simulator snapshots the cluster, calls `plan` with the
waiting jobs, starts the placements and applies preemptions (a preempted job re-queues and
restarts from scratch). Runtime estimates are the true durations (perfect estimates), which
is the usual convention for SJF and EASY backfill studies.

Queue policies: ``fcfs`` (strict: later jobs wait behind a blocked head), ``backfill`` (FCFS with
EASY backfill), ``sjf``, ``priority`` and ``fairshare``. Philly has neither priorities nor
projects, so each job gets a synthetic priority class (0-2) and project (p0-p3) from its index;
they only matter to those two policies. Preemption is off in this replay: a preempted Philly
job would restart from scratch (the trace has no checkpoints), which only measures restart
waste. ``oracle-srtf`` is the lower bound: preemptive shortest-remaining-time-first on a
fungible pool of GPUs, with free and instant preemption.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from scheduler.core.model import (
    MILLI,
    GpuView,
    JobRequest,
    NodeView,
    ProjectQuota,
    RunningWork,
    Share,
    Snapshot,
)
from scheduler.core.plan import PolicyConfig, plan
from scheduler.core.traces import JobRow

QUEUE_SIM_POLICIES = ("fcfs", "backfill", "sjf", "priority", "fairshare", "oracle-srtf")


@dataclass(frozen=True, slots=True)
class QueueResult:
    policy: str
    jobs: int
    avg_jct: float
    p50_jct: float
    p95_jct: float
    p99_jct: float
    avg_wait: float
    utilization: float
    makespan: float
    dropped: int
    seconds: float
    # Stopped early (Ctrl-C): the figures are over the jobs finished by then.
    interrupted: bool = False
    total: int = 0  # jobs the run was given (fitting the cluster)


def _config(policy: str, scorer: str, seed: int) -> PolicyConfig:
    base = PolicyConfig(
        scorer=scorer, seed=seed, estimate_starts=False, elastic=False, preemption=False
    )
    if policy == "fcfs":
        return replace(base, queue="fcfs", backfill=False, strict_order=True)
    if policy == "backfill":
        return replace(base, queue="fcfs", backfill=True)
    if policy == "sjf":
        return replace(base, queue="sjf", backfill=False, strict_order=False)
    if policy == "priority":
        return replace(base, queue="priority", backfill=True)
    if policy == "fairshare":
        return replace(base, queue="fairshare", backfill=True)
    raise ValueError(
        f"unknown queue policy {policy!r}; choose one of {', '.join(QUEUE_SIM_POLICIES)}"
    )


def _summarise(
    policy: str,
    submit: Sequence[float],
    start: Sequence[float],
    finish: Sequence[float],
    gpus: Sequence[int],
    durations: Sequence[float],
    total_gpus: int,
    dropped: int,
    t0: float,
) -> QueueResult:
    sub = np.asarray(submit)
    fin = np.asarray(finish)
    jct = fin - sub
    wait = np.asarray(start) - sub
    span = float(fin.max() - sub.min()) if len(fin) else 0.0
    busy = float(np.dot(np.asarray(gpus, dtype=float), np.asarray(durations)))
    util = busy / (total_gpus * span) if span > 0 else 0.0
    return QueueResult(
        policy=policy,
        jobs=len(jct),
        avg_jct=float(jct.mean()) if len(jct) else 0.0,
        p50_jct=float(np.percentile(jct, 50)) if len(jct) else 0.0,
        p95_jct=float(np.percentile(jct, 95)) if len(jct) else 0.0,
        p99_jct=float(np.percentile(jct, 99)) if len(jct) else 0.0,
        avg_wait=float(wait.mean()) if len(wait) else 0.0,
        utilization=util,
        makespan=span,
        dropped=dropped,
        seconds=time.perf_counter() - t0,
    )


def simulate_queue(
    jobs: Sequence[JobRow],
    total_gpus: int,
    gpus_per_node: int,
    policy: str,
    scorer: str = "default",
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> QueueResult:
    """Replay `jobs`. `progress(finished, total)` is called as jobs finish; a KeyboardInterrupt
    (Ctrl-C, or raised by `progress`) stops the run and returns the figures so far, marked
    `interrupted`."""
    t0 = time.perf_counter()
    if total_gpus < 1 or gpus_per_node < 1:
        raise ValueError("the cluster needs at least one GPU and one GPU per node")
    fitting = [j for j in jobs if j.gpus <= total_gpus]
    dropped = len(jobs) - len(fitting)
    if policy == "oracle-srtf":
        return _srtf(fitting, total_gpus, dropped, t0, progress)
    cfg = _config(policy, scorer, seed)
    n_nodes = math.ceil(total_gpus / gpus_per_node)
    origin = fitting[0].submit_s if fitting else 0.0
    sub = [j.submit_s - origin for j in fitting]
    # node layout: n_nodes × gpus_per_node (the last node takes the remainder)
    layout = []
    gid = 0
    for n in range(n_nodes):
        k = min(gpus_per_node, total_gpus - n * gpus_per_node)
        layout.append([gid + i for i in range(k)])
        gid += k
    used: dict[int, int] = {}  # gpu id -> job index
    running: dict[int, tuple[float, tuple[Share, ...]]] = {}
    start = [math.nan] * len(fitting)
    finish = [math.nan] * len(fitting)
    waiting: list[int] = []
    events: list[tuple[float, int, int]] = [(s, 1, i) for i, s in enumerate(sub)]
    heapq.heapify(events)
    quotas = {f"p{k}": ProjectQuota(weight=1.0) for k in range(4)}
    try:
        _replay(
            events,
            waiting,
            running,
            used,
            start,
            finish,
            fitting,
            sub,
            layout,
            quotas,
            cfg,
            seed,
            progress,
        )
        interrupted = False
    except KeyboardInterrupt:
        interrupted = True
    ok = [i for i in range(len(fitting)) if not math.isnan(finish[i])]
    result = _summarise(
        policy,
        [sub[i] for i in ok],
        [start[i] for i in ok],
        [finish[i] for i in ok],
        [fitting[i].gpus for i in ok],
        [fitting[i].duration_s for i in ok],
        total_gpus,
        dropped + (0 if interrupted else len(fitting) - len(ok)),
        t0,
    )
    return replace(result, interrupted=interrupted, total=len(fitting))


def _replay(
    events: list[tuple[float, int, int]],
    waiting: list[int],
    running: dict[int, tuple[float, tuple[Share, ...]]],
    used: dict[int, int],
    start: list[float],
    finish: list[float],
    fitting: Sequence[JobRow],
    sub: list[float],
    layout: list[list[int]],
    quotas: dict[str, ProjectQuota],
    cfg: PolicyConfig,
    seed: int,
    progress: Callable[[int, int], None] | None,
) -> int:
    """The event loop of `simulate_queue`; fills `start` and `finish` as it goes."""
    epoch = 0
    done = 0
    total = len(fitting)
    while events:
        now = events[0][0]
        finished_before = done
        while events and events[0][0] <= now:
            t, kind, i = heapq.heappop(events)
            if kind == 1:
                waiting.append(i)
            elif i in running and running[i][0] == t:
                for s in running.pop(i)[1]:
                    used.pop(s.gpu_id, None)
                finish[i] = t
                done += 1
        if progress is not None and done != finished_before:
            progress(done, total)
        if not waiting:
            continue
        snap = _snapshot(layout, used, running, fitting, quotas)
        queue = [
            JobRequest(
                job_id=i,
                project=f"p{i % 4}",
                submitted_at=sub[i],
                gpus=fitting[i].gpus,
                priority=i % 3,
                preemptible=True,
                runtime_estimate_s=max(1, math.ceil(fitting[i].duration_s)),
            )
            for i in waiting
        ]
        epoch += 1
        result = plan(snap, queue, replace(cfg, seed=seed + epoch), now)
        for pre in result.preemptions:
            i = pre.job_id
            if i in running:
                for s in running.pop(i)[1]:
                    used.pop(s.gpu_id, None)
                start[i] = math.nan
                waiting.append(i)
        placed = set()
        for p in result.placements:
            i = p.job_id
            end = now + fitting[i].duration_s
            running[i] = (end, p.shares)
            for s in p.shares:
                used[s.gpu_id] = i
            start[i] = now  # a preempted job restarts from scratch
            placed.add(i)
            heapq.heappush(events, (end, 0, i))
        waiting[:] = [i for i in waiting if i not in placed]
    return done


def _snapshot(
    layout: list[list[int]],
    used: dict[int, int],
    running: dict[int, tuple[float, tuple[Share, ...]]],
    jobs: Sequence[JobRow],
    quotas: dict[str, ProjectQuota],
) -> Snapshot:
    nodes = tuple(
        NodeView(
            node_id=n,
            name=f"node-{n:03d}",
            pool="default",
            gpus=tuple(
                GpuView(g, k, "GPU", 24_576, MILLI, MILLI if g in used else 0, 0, "exclusive")
                for k, g in enumerate(gids)
            ),
            cpu_milli_free=1 << 30,
            memory_mib_free=1 << 30,
        )
        for n, gids in enumerate(layout)
    )
    work = tuple(
        RunningWork(
            job_id=i,
            project=f"p{i % 4}",
            priority=i % 3,
            preemptible=True,
            started_at=end - jobs[i].duration_s,
            min_runtime_s=600,
            runtime_estimate_s=max(1, math.ceil(jobs[i].duration_s)),
            shares=shares,
        )
        for i, (end, shares) in sorted(running.items())
    )
    return Snapshot(nodes=nodes, running=work, quotas=quotas)


def _srtf(
    jobs: Sequence[JobRow],
    total_gpus: int,
    dropped: int,
    t0: float,
    progress: Callable[[int, int], None] | None = None,
) -> QueueResult:
    """Preemptive shortest-remaining-time-first over a fungible GPU pool (lower bound)."""
    origin = jobs[0].submit_s if jobs else 0.0
    sub = [j.submit_s - origin for j in jobs]
    remaining = [j.duration_s for j in jobs]
    start = [math.nan] * len(jobs)
    finish = [math.nan] * len(jobs)
    active: list[int] = []
    nxt = 0
    now = 0.0
    n = len(jobs)
    done = 0
    interrupted = False
    try:
        while nxt < n or active:
            nxt, now, done = _srtf_step(
                jobs, sub, remaining, start, finish, active, nxt, now, done, total_gpus
            )
            if progress is not None:
                progress(done, n)
    except KeyboardInterrupt:
        interrupted = True
    ok = [i for i in range(n) if not math.isnan(finish[i])]
    result = _summarise(
        "oracle-srtf",
        [sub[i] for i in ok],
        [start[i] for i in ok],
        [finish[i] for i in ok],
        [jobs[i].gpus for i in ok],
        [jobs[i].duration_s for i in ok],
        total_gpus,
        dropped,
        t0,
    )
    return replace(result, interrupted=interrupted, total=n)


def _srtf_step(
    jobs: Sequence[JobRow],
    sub: list[float],
    remaining: list[float],
    start: list[float],
    finish: list[float],
    active: list[int],
    nxt: int,
    now: float,
    done: int,
    total_gpus: int,
) -> tuple[int, float, int]:
    """One step of `_srtf`: admit arrivals, run the shortest, advance to the next event."""
    n = len(jobs)
    if not active and nxt < n:
        now = max(now, sub[nxt])
    while nxt < n and sub[nxt] <= now:
        active.append(nxt)
        nxt += 1
    active.sort(key=lambda i: (remaining[i], sub[i], i))
    free = total_gpus
    run = []
    for i in active:
        if jobs[i].gpus <= free:
            run.append(i)
            free -= jobs[i].gpus
    for i in run:
        if math.isnan(start[i]):
            start[i] = now
    step = min(remaining[i] for i in run) if run else math.inf
    if nxt < n:
        step = min(step, sub[nxt] - now)
    step = max(step, 0.0)
    for i in run:
        remaining[i] -= step
    now += step
    for i in run:
        if remaining[i] <= 1e-9:
            finish[i] = now
            done += 1
    active[:] = [i for i in active if math.isnan(finish[i])]
    return nxt, now, done
