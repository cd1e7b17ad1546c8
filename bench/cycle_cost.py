"""The scheduling cycle's CPU as a function of the fleet snapshot (the capacity model's worker).

    .venv/bin/python -m bench.cycle_cost [--runs 5]

For each snapshot of a grid (ready nodes × 8 GPUs, running one-GPU allocations, queued one-GPU
jobs that all fit), the real `scheduler.cycle.run_cycle` runs `--runs` times, each in a
transaction rolled back so every run sees the same snapshot; the snapshot itself is built in an
outer transaction, rolled back after its runs. CPU is this process's (the cycle runs here, as in
the worker) and its own PostgreSQL backend's (from /proc). The medians per snapshot are fitted
by least squares to

    CPU per cycle = fixed + per node × ready nodes + per allocation × running allocations
                    + per job × jobs placed

which `bench.load` and docs/capacity.md use for the worker's cycles.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from typing import Any

from bench import command_line, markdown_table, spread, write_section
from bench.django_env import setup, teardown

GRID_NODES = (5, 50, 200)
GRID_RUNNING_PER_NODE = (0.0, 1.5, 6.0)  # 1.5: bench.load's 1/20 mix (75 on 50 nodes)
GRID_PLACED = (1, 8)
TERMS = ("fixed", "per node", "per allocation", "per job placed")


def base() -> dict[str, Any]:
    from portal.models import Project, User
    from scheduler.models import GpuModel, Pool
    from scheduler.seed import catalog_seed

    catalog_seed()
    pool = Pool.objects.create(name="default", queue_policy="priority")
    user = User.objects.create_user("bench@example.org", "x")
    project = Project.objects.create(slug="bench", name="Bench")
    return {
        "pool": pool,
        "user": user,
        "project": project,
        "model": GpuModel.objects.get(name="H100-80GB-SXM"),
    }


def snapshot(fx: dict[str, Any], nodes: int, running: int, queued: int, tag: str) -> None:
    """`nodes` ready nodes of 8 GPUs, `running` one-GPU jobs running on them (spread over
    the nodes, as the scheduler's packing leaves them at bench.load's rate), `queued` one-GPU
    jobs waiting, all of which fit."""
    from django.utils import timezone

    from scheduler.models import Allocation, Gpu, Job, JobState, Node

    now = timezone.now()
    rng = random.Random(nodes * 1000 + running)
    made = Node.objects.bulk_create(
        Node(
            name=f"{tag}-n{i:05d}",
            pool=fx["pool"],
            state=Node.State.READY,
            cpu_milli=128_000,
            memory_mib=1_048_576,
            last_heartbeat_at=now,
        )
        for i in range(nodes)
    )
    gpus = Gpu.objects.bulk_create(
        Gpu(
            node=node,
            index=k,
            uuid=f"GPU-{tag}-{node.pk}-{k}",
            model=fx["model"],
            memory_mib=fx["model"].memory_mib,
        )
        for node in made
        for k in range(8)
    )
    busy = [gpus[(i % nodes) * 8 + i // nodes] for i in range(running)]  # round robin
    jobs = Job.objects.bulk_create(
        Job(
            project=fx["project"],
            submitted_by=fx["user"],
            name=f"{tag}-r{i}",
            command="sleep 30",
            state=JobState.RUNNING,
            gpus=1,
            attempt=1,
            started_at=now,
            runtime_estimate_s=rng.randint(60, 3600),
        )
        for i in range(running)
    )
    Allocation.objects.bulk_create(
        Allocation(
            job=job,
            gpu=gpu,
            node_id=gpu.node_id,
            attempt=1,
            share_milli=1000,
            gpu_model_id=gpu.model_id,
            started_at=now,
        )
        for job, gpu in zip(jobs, busy, strict=True)
    )
    Job.objects.bulk_create(
        Job(
            project=fx["project"],
            submitted_by=fx["user"],
            name=f"{tag}-q{i}",
            command="sleep 30",
            state=JobState.QUEUED,
            gpus=1,
            gpu_model=fx["model"],
            runtime_estimate_s=rng.randint(60, 3600),
            queued_at=now,
        )
        for i in range(queued)
    )


def measure(runs: int) -> list[dict[str, Any]]:
    from django.db import transaction

    from bench.endpoint_cost import own_backend_cpu
    from scheduler.cycle import run_cycle

    fx = base()
    out = []
    for nodes in GRID_NODES:
        for per_node in GRID_RUNNING_PER_NODE:
            running = round(nodes * per_node)
            for placed in GRID_PLACED:
                cpu, pg, wall = [], [], []
                with transaction.atomic():
                    snapshot(fx, nodes, running, placed, f"s{nodes}-{running}-{placed}")
                    for _ in range(runs + 1):  # the first warms the caches up; not counted
                        with transaction.atomic():
                            c0, p0, w0 = time.process_time(), own_backend_cpu(), time.perf_counter()
                            result = run_cycle()
                            w1, c1, p1 = time.perf_counter(), time.process_time(), own_backend_cpu()
                            transaction.set_rollback(True)
                        if len(result.placed) != placed:
                            raise SystemExit(
                                f"{nodes} nodes, {running} running: placed {len(result.placed)} "
                                f"of {placed}"
                            )
                        cpu.append((c1 - c0) * 1000)
                        pg.append(max(0.0, p1 - p0) * 1000)
                        wall.append((w1 - w0) * 1000)
                    transaction.set_rollback(True)
                row: dict[str, Any] = {
                    "nodes": nodes,
                    "running": running,
                    "placed": placed,
                    "cpu": cpu[1:],
                    "pg": pg[1:],
                    "wall": wall[1:],
                }
                print(
                    f"{nodes:4d} nodes {running:5d} running {placed:2d} placed: "
                    f"cpu {spread(row['cpu'])} ms, pg {spread(row['pg'])} ms",
                    flush=True,
                )
                out.append(row)
    return out


def fit(rows: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Least squares of the medians on the four terms (ms)."""
    import numpy as np

    a = np.array([[1.0, r["nodes"], r["running"], r["placed"]] for r in rows])
    b = np.array([statistics.median(r[key]) for r in rows])
    coef, *_ = np.linalg.lstsq(a, b, rcond=None)
    return dict(zip(TERMS, (float(c) for c in coef), strict=True))


def predict(coef: dict[str, float], nodes: float, running: float, placed: float) -> float:
    return (
        coef["fixed"]
        + coef["per node"] * nodes
        + coef["per allocation"] * running
        + coef["per job placed"] * placed
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    setup("cyclecost")
    try:
        rows = measure(args.runs)
    finally:
        teardown()
    cpu, pg = fit(rows, "cpu"), fit(rows, "pg")
    table = markdown_table(
        [
            "ready nodes",
            "running allocations",
            "jobs placed",
            "worker CPU ms/cycle (median, min–max)",
            "fitted",
            "PostgreSQL CPU ms/cycle",
            "fitted",
            "wall ms/cycle",
        ],
        [
            [
                str(r["nodes"]),
                str(r["running"]),
                str(r["placed"]),
                spread(r["cpu"]),
                f"{predict(cpu, r['nodes'], r['running'], r['placed']):.1f}",
                spread(r["pg"]),
                f"{predict(pg, r['nodes'], r['running'], r['placed']):.1f}",
                spread(r["wall"]),
            ]
            for r in rows
        ],
    )
    terms = markdown_table(
        ["term", "worker CPU ms", "PostgreSQL CPU ms"],
        [[t, f"{cpu[t]:.3f}", f"{pg[t]:.3f}"] for t in TERMS],
    )
    print(table + "\n\n" + terms)
    if args.no_docs:
        return
    data = json.dumps({"cpu_ms": cpu, "pg_ms": pg}, sort_keys=True)
    write_section(
        "cycle_cost",
        "## The scheduling cycle's CPU by fleet snapshot (the capacity model's worker)\n\n"
        f"`{command_line('bench.cycle_cost')}` — the real `run_cycle` in the benchmark's "
        f"process on PostgreSQL, {args.runs} runs per snapshot after one warm-up, each rolled "
        "back so every run sees the same snapshot; nodes of 8 GPUs, one-GPU jobs, the queued "
        "ones all placed. CPU: the process's and its own PostgreSQL backend's (/proc, 10 ms "
        "ticks: the PostgreSQL column is coarse per cycle). Fitted by least squares on the "
        "medians: CPU per cycle = fixed + per node × ready nodes + per allocation × running "
        "allocations + per job × jobs placed.\n\n"
        + table
        + "\n\n"
        + terms
        + f"\n\n<!-- cycle_cost:data {data} -->",
    )


if __name__ == "__main__":
    main()
