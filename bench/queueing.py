"""Queueing benchmark: queue policies on a Philly virtual cluster at two cluster sizes.

.venv/bin/python -m bench.queueing [--cluster 103959] [--sizes 24,32] [--limit N]
"""

from __future__ import annotations

import argparse
import time
from multiprocessing import Pool

from bench import SHARED, command_line, machine, markdown_table, write_section
from scheduler.core.queueing import QUEUE_SIM_POLICIES, QueueResult, simulate_queue
from scheduler.core.traces import read_jobs


def _run(args: tuple[str, str, int | None, int, int, str]) -> tuple[int, QueueResult]:
    path, cluster, limit, gpus, per_node, policy = args
    jobs = read_jobs(path, cluster, limit)
    return gpus, simulate_queue(jobs, gpus, per_node, policy)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--jobs", default=str(SHARED / "traces" / "philly" / "philly-dev.csv"))
    ap.add_argument("--cluster", default="103959")
    ap.add_argument("--sizes", default="24,32")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args()
    sizes = [int(x) for x in a.sizes.split(",")]
    tasks = [
        (a.jobs, a.cluster, a.limit, g, a.gpus_per_node, p)
        for g in sizes
        for p in QUEUE_SIM_POLICIES
    ]
    host = machine()
    t0 = time.perf_counter()
    with Pool(a.workers) as pool:
        results = pool.map(_run, tasks, chunksize=1)
    wall = time.perf_counter() - t0
    cols = [
        "GPUs",
        "policy",
        "jobs",
        "avg JCT (h)",
        "p95 JCT (h)",
        "p99 JCT (h)",
        "avg wait (h)",
        "util",
        "avg JCT ÷ FCFS",
        "p99 ÷ FCFS",
        "avg JCT ÷ oracle",
        "p99 ÷ oracle",
    ]
    rows = []
    for g in sizes:
        rs = {r.policy: r for gg, r in results if gg == g}
        fc, orc = rs["fcfs"], rs["oracle-srtf"]
        for p in QUEUE_SIM_POLICIES:
            r = rs[p]
            rows.append(
                [
                    str(g),
                    p,
                    str(r.jobs),
                    f"{r.avg_jct / 3600:.2f}",
                    f"{r.p95_jct / 3600:.2f}",
                    f"{r.p99_jct / 3600:.2f}",
                    f"{r.avg_wait / 3600:.2f}",
                    f"{r.utilization:.2f}",
                    f"{r.avg_jct / fc.avg_jct:.2f}",
                    f"{r.p99_jct / fc.p99_jct:.2f}",
                    f"{r.avg_jct / orc.avg_jct:.2f}",
                    f"{r.p99_jct / orc.p99_jct:.2f}",
                ]
            )
    table = markdown_table(cols, rows)
    body = "\n".join(
        [
            "## Queueing: job completion time on Philly",
            "",
            "```",
            command_line("bench.queueing"),
            "```",
            "",
            f"Philly virtual cluster `{a.cluster}` (arrivals and durations replayed; "
            f"{a.gpus_per_node} GPUs per node; jobs larger than the cluster dropped) at "
            f"{' and '.join(map(str, sizes))} GPUs, every event driving the same `plan()` as "
            "production with the default scorer. Runtime estimates are the true durations. "
            "`fcfs` is strict (no backfill); `backfill` is FCFS + EASY; `priority` and `fairshare` "
            "use EASY backfill too and synthetic priority classes / projects (Philly has neither); "
            "preemption is off (Philly jobs cannot resume from a checkpoint). `oracle-srtf` is "
            "preemptive shortest-remaining-time-first "
            "on a fungible GPU pool with free preemption: a lower bound, not a real policy.",
            "",
            table,
            "",
            "One replay per cell: the simulation is deterministic (no timing in its results), "
            "so the p95 and p99 columns are the spread that matters; the JCTs are simulated "
            f"hours, not measured. Wall time {wall:.0f} s with {a.workers} worker processes.",
            "",
            host,
        ]
    )
    print(table)
    if not a.no_docs:
        write_section("queueing", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
