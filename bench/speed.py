"""Speed benchmark: placements per second for each scorer, and plan() throughput.

    .venv/bin/python -m bench.speed [--runs 3] [--pods 3000]

Clusters: the Alibaba GPU cluster (1,213 nodes, 6,212 GPUs) and a synthetic one with 5,000
nodes × 8 GPUs (40,000 GPUs, the same seven GPU models). Pods: the Alibaba `default` trace,
resampled as in the packing benchmark; the clock covers placement only (feasibility, scoring,
bookkeeping), not trace loading. Medians of several runs (different seeds).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from bench import SHARED, command_line, markdown_table, spread, write_section
from scheduler.core.model import JobRequest
from scheduler.core.packing import (
    _DemandCache,
    _place_one,
    cluster_from_nodes,
    resample,
    snapshot_of,
    typical_shapes,
)
from scheduler.core.plan import PolicyConfig, plan
from scheduler.core.scorers import SCORER_NAMES, make_scorer
from scheduler.core.traces import NodeRow, PodRow, read_nodes, read_pods

MODELS = ("G2", "T4", "V100M16", "V100M32", "G3", "P100", "A10")


def synthetic_nodes(n: int = 5000, gpus: int = 8) -> list[NodeRow]:
    return [
        NodeRow(f"syn-{i:05d}", 128_000, 1_048_576, gpus, MODELS[i % len(MODELS)]) for i in range(n)
    ]


def placements_per_s(
    nodes: list[NodeRow], pods: list[PodRow], policy: str, seed: int, n_pods: int
) -> float:
    st = cluster_from_nodes(nodes)
    st.tie_rank = np.random.default_rng(seed + 1).permutation(st.n_nodes).astype(np.int64)
    scorer = make_scorer(policy, typical_shapes(pods))
    arrivals = resample(pods, int(st.gpu_cap.sum()), 1.3, seed)[:n_pods]
    demands = _DemandCache(st)
    node_ok = np.ones(st.n_nodes, dtype=bool)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for i in arrivals:
        _place_one(st, scorer, demands.get(pods[i]), node_ok, rng)
    return len(arrivals) / (time.perf_counter() - t0)


def plan_jobs_per_s(nodes: list[NodeRow], pods: list[PodRow], seed: int, batch: int) -> float:
    st = cluster_from_nodes(nodes)
    arrivals = resample(pods, int(st.gpu_cap.sum()), 1.3, seed)[:batch]
    snap = snapshot_of(st)
    queue = [
        JobRequest(
            job_id=k,
            project="p",
            submitted_at=float(k),
            gpus=pods[i].num_gpu,
            gpu_milli=pods[i].gpu_milli if pods[i].num_gpu else 1000,
            models=pods[i].gpu_spec,
            cpu_milli=pods[i].cpu_milli,
            memory_mib=pods[i].memory_mib,
        )
        for k, i in enumerate(arrivals)
    ]
    cfg = PolicyConfig(typical_shapes=tuple(typical_shapes(pods)), seed=seed)
    t0 = time.perf_counter()
    plan(snap, queue, cfg, now=0.0)
    return len(queue) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pods", type=int, default=3000)
    ap.add_argument("--policies", default=",".join(SCORER_NAMES))
    ap.add_argument("--data", default=str(SHARED / "traces" / "alibaba-gpu-v2023"))
    ap.add_argument("--no-docs", action="store_true")
    a = ap.parse_args()
    data = Path(a.data)
    ali = read_nodes(data / "openb_node_list_gpu_node.csv")
    pods = read_pods(data / "openb_pod_list_default.csv")
    syn = synthetic_nodes()
    rows = []
    seeds = [42 + k for k in range(a.runs)]
    for p in [x for x in a.policies.split(",") if x]:
        r1 = [placements_per_s(ali, pods, p, s, a.pods) for s in seeds]
        r2 = [placements_per_s(syn, pods, p, s, a.pods) for s in seeds]
        rows.append([p, spread(r1, 0), spread(r2, 0)])
        print(p, spread(r1, 0), spread(r2, 0), flush=True)
    plan_rates = [plan_jobs_per_s(ali, pods, s, 200) for s in seeds]
    plan_rate = statistics.median(plan_rates)
    cols = [
        "scorer",
        "Alibaba 1,213 nodes / 6,212 GPUs (placements/s, median (min–max))",
        "synthetic 5,000 nodes / 40,000 GPUs (placements/s, median (min–max))",
    ]
    table = markdown_table(cols, rows)
    default = next((r for r in rows if r[0] == "default"), None)
    verdict = []
    if default:
        d1 = float(default[1].split(" ")[0].replace(",", ""))
        d2 = float(default[2].split(" ")[0].replace(",", ""))
        verdict = [
            f"- default at Alibaba scale: {d1:,.0f}/s vs target ≥ 1,000/s — "
            f"{'met' if d1 >= 1000 else 'MISSED'}",
            f"- default at 5,000 nodes: {d2:,.0f}/s vs target ≥ 300/s — "
            f"{'met' if d2 >= 300 else 'MISSED'}; Kubernetes scheduler anchor ≥ 180 pods/s at "
            f"5,000 nodes ({d2 / 180:.1f}×); Slurm quotes 500 jobs/s ({d2 / 500:.1f}×)",
        ]
    body = "\n".join(
        [
            "## Speed: placements per second",
            "",
            "```",
            command_line("bench.speed"),
            "```",
            "",
            f"One pod at a time, first {a.pods} arrivals of the resampled Alibaba `default` trace, "
            f"median of {a.runs} seeds, one process on this machine. The timer covers feasibility "
            "filtering, scoring of every feasible node (FGD/default: every feasible GPU of every "
            "node for a fraction) and bookkeeping.",
            "",
            table,
            "",
            *verdict,
            f"- `plan()` itself (whole queue of 200 jobs against the Alibaba cluster snapshot, "
            f"including building the snapshot arrays, EASY reservation, messages): "
            f"{spread(plan_rates, 0)} jobs/s (median (min–max) of {a.runs} seeds).",
        ]
    )
    print(table)
    print("\n".join(verdict))
    print(f"plan(): {plan_rate:,.0f} jobs/s")
    if not a.no_docs:
        write_section("speed", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
