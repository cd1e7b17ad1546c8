"""Slurm-backed pools: metering `sacct` records into the ledger, this code against a baseline.

    .venv/bin/python -m bench.slurm_metering [--records 100000] [--runs 3]
        [--baseline-rev REV] [--pair-records 5000] [--pairs 2]

Each measurement is a fresh process on a fresh database (`<DATABASE_URL's name>_slurm_meter`):
a Slurm pool with two mirrored nodes of 8 A100s, one portal job (and its Slurm link) per
synthetic job, then `billing.slurm.meter_day` for the day, exactly as beat's `slurm-meter`
task runs it: `sacct --json` (a stand-in `sacct` on PATH prints the day's records: the only
part not real), the parser (`parse_sacct`), the ledger writer (`write_runs`: allocations, then
billing's `usage_meter`: slices, prices, draft invoices, meters). Then the same day again,
which must write nothing (idempotent) and leave every total as it was.

Records: 1-8 A100s, 5 min to 3 h, every 50th job requeued twice (three runs), about 2.5
hourly slices per GPU: about 8 usage records per sacct record, as in the issue's run.

Baseline (`--baseline-rev`, default: the commit before the set-based metering): the same
measurement in a copy of that commit's tree (`git archive`), same records, alternating with
this tree's (baseline, this, baseline, this ...) at `--pair-records` (the baseline runs about
50 records/s, so 100,000 records would take it half an hour or more). Then this tree alone at
`--records`, `--runs` times.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

from bench import REPO, command_line, markdown_table, spread, write_section

BASELINE_REV = "9bc281c"  # main before the set-based metering (issue 17's follow-up)
DAY = date(2026, 11, 3)


def synthetic_sacct(slurm_ids: list[str], seed: int = 7) -> list[dict[str, Any]]:
    """`sacct --json` job records (the fields `parse_sacct` reads, in 22.05's shape) for the
    given Slurm job ids: 1, 2, 4 or 8 A100s on gpu-a and/or gpu-b, every 50th job three runs."""
    import random

    rng = random.Random(seed)
    day = datetime(DAY.year, DAY.month, DAY.day, tzinfo=UTC).timestamp()
    records = []
    for i, sid in enumerate(slurm_ids):
        runs = 3 if i % 50 == 0 else 1  # every 50th was requeued twice
        t = int(day + rng.uniform(0, 20 * 3600))
        gpus = rng.choice([1, 1, 2, 4, 8])
        nodes = "gpu-[a-b]" if gpus == 8 else rng.choice(["gpu-a", "gpu-b"])
        for _ in range(runs):
            elapsed = int(rng.uniform(300, 3 * 3600))
            records.append(
                {
                    "job_id": int(sid),
                    "account": "bench",
                    "nodes": nodes,
                    "array": {"job_id": 0, "task_id": None},
                    "state": {"current": "COMPLETED", "reason": "None"},
                    "time": {
                        "start": t,
                        "end": t + elapsed,
                        "elapsed": elapsed,
                        "submission": t - 5,
                    },
                    "tres": {
                        "allocated": [
                            {"type": "cpu", "name": None, "id": 1, "count": gpus * 4},
                            {"type": "gres", "name": "gpu", "id": 1001, "count": gpus},
                            {"type": "gres", "name": "gpu:a100", "id": 1002, "count": gpus},
                        ]
                    },
                    "steps": [
                        {
                            "step": {"name": "batch"},
                            "time": {"elapsed": elapsed},
                            "tres": {
                                "allocated": [{"type": "gres", "name": "gpu:a100", "count": gpus}]
                            },
                        }
                    ],
                }
            )
            t += elapsed + 60
    return records


def measure(records_wanted: int, workdir: Path) -> dict[str, Any]:
    """One measurement in this process (the worker): fixtures, the day metered twice."""
    from django.db.models import Count, Sum

    from bench.django_env import setup, teardown

    setup("slurm_meter")
    from billing.models import UsageRecord
    from billing.slurm import meter_day, parse_sacct
    from portal.models import User
    from portal.services import project_create
    from scheduler.backends.slurm.models import SlurmJob, SlurmPool
    from scheduler.models import Allocation, Gpu, GpuModel, Job, JobState, Node, Pool
    from scheduler.seed import catalog_seed

    t0 = time.perf_counter()
    catalog_seed()
    user = User.objects.create_user("meter@example.org", "x")
    project = project_create(owner=user, slug="bench", name="Bench")
    pool = Pool.objects.create(name="hpc", backend=Pool.Backend.SLURM)
    SlurmPool.objects.create(
        pool=pool,
        cluster_name="bench",
        conf_path=str(workdir / "slurm.conf"),  # the stand-in sacct reads its records beside it
        gpu_types={"A100-80GB": "a100"},
        output_dir=str(workdir),
    )
    model = GpuModel.objects.get(name="A100-80GB")
    for name in ("gpu-a", "gpu-b"):
        node = Node.objects.create(
            name=f"hpc.{name}",
            pool=pool,
            provider=Node.Provider.SLURM,
            state=Node.State.READY,
            cpu_milli=16_000,
            memory_mib=65_536,
            labels={"slurm_name": name},
        )
        Gpu.objects.bulk_create(
            Gpu(node=node, index=i, uuid=f"slurm-bench-{name}-{i}", model=model, memory_mib=81920)
            for i in range(8)
        )
    n_jobs = records_wanted * 50 // 52  # every 50th job has three runs: records ≈ wanted
    jobs = Job.objects.bulk_create(
        [
            Job(
                project=project,
                submitted_by=user,
                name=f"m{i}",
                command="true",
                gpu_model=model,
                pool=pool,
                state=JobState.SUCCEEDED,
            )
            for i in range(n_jobs)
        ],
        batch_size=5000,
    )
    sids = [str(100_000 + i) for i in range(n_jobs)]
    SlurmJob.objects.bulk_create(
        [
            SlurmJob(job=j, pool=pool, slurm_job_id=sid, submitted_at=datetime.now(UTC))
            for j, sid in zip(jobs, sids, strict=True)
        ],
        batch_size=5000,
    )
    records = synthetic_sacct(sids)
    (workdir / "sacct.json").write_text(json.dumps({"jobs": records, "errors": []}))
    expected_gpu_s = sum(r["tres"]["allocated"][2]["count"] * r["time"]["elapsed"] for r in records)
    fixtures_s = time.perf_counter() - t0

    a = time.perf_counter()
    parsed = parse_sacct(json.loads((workdir / "sacct.json").read_text()))
    parse_s = time.perf_counter() - a
    del parsed

    now = datetime(2026, 11, 6, tzinfo=UTC)  # every run has ended
    a = time.perf_counter()
    first = meter_day(pool, DAY, now=now)
    first_s = time.perf_counter() - a

    def totals() -> dict[str, Any]:
        agg = UsageRecord.objects.aggregate(
            n=Count("pk"), ms=Sum("milli_seconds"), amount=Sum("amount")
        )
        return {
            "usage": agg["n"],
            "gpu_s": (agg["ms"] or 0) // 1000,
            "amount": str(agg["amount"]),
            "allocations": Allocation.objects.count(),
        }

    after_first = totals()
    a = time.perf_counter()
    again = meter_day(pool, DAY, now=now)
    again_s = time.perf_counter() - a
    after_again = totals()
    teardown()
    return {
        "records": len(records),
        "jobs": n_jobs,
        "fixtures_s": fixtures_s,
        "parse_s": parse_s,
        "first_s": first_s,
        "again_s": again_s,
        "runs_ours": first.ours,
        "usage_written": first.meter.records,
        "again_allocations": again.allocations_created + again.allocations_updated,
        "again_usage": again.meter.records,
        "expected_gpu_s": expected_gpu_s,
        "after_first": after_first,
        "after_again": after_again,
        "load": os.getloadavg()[0],
    }


def run_worker(tree: Path, records: int) -> dict[str, Any]:
    """One measurement in a fresh process of `tree` (this checkout or the baseline's copy)."""
    with tempfile.TemporaryDirectory(prefix="bench-sacct.") as tmp:
        work = Path(tmp)
        stub = work / "bin" / "sacct"
        stub.parent.mkdir()
        stub.write_text('#!/bin/sh\nexec cat "$(dirname "$SLURM_CONF")/sacct.json"\n')
        stub.chmod(0o755)
        env = {**os.environ, "PATH": f"{stub.parent}:{os.environ.get('PATH', '')}"}
        out = work / "result.json"
        cmd = [sys.executable, "-m", "bench.slurm_metering", "--worker", str(records)]
        subprocess.run(
            [*cmd, "--workdir", str(work), "--out", str(out)], cwd=tree, env=env, check=True
        )
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def baseline_tree(rev: str, into: Path) -> Path:
    """The tree of `rev` (git archive), with this benchmark copied in (it reads only what
    both have: models, `meter_day`, `parse_sacct`)."""
    archive = into / "tree.tar"
    with archive.open("wb") as fh:
        subprocess.run(["git", "archive", rev], cwd=REPO, stdout=fh, check=True)
    tree = into / "tree"
    tree.mkdir()
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    shutil.copy(Path(__file__), tree / "bench" / "slurm_metering.py")
    return tree


def check(result: dict[str, Any], label: str) -> None:
    """The ledger is right and the re-read wrote nothing (else the figures mean nothing)."""
    first, again = result["after_first"], result["after_again"]
    if first["gpu_s"] != result["expected_gpu_s"]:
        raise SystemExit(f"{label}: metered {first['gpu_s']} GPU-s, sacct says {result}")
    if first != again or result["again_allocations"] or result["again_usage"]:
        raise SystemExit(f"{label}: re-reading the day changed the ledger: {result}")


def render(
    args: argparse.Namespace,
    pairs: dict[str, list[dict[str, Any]]],
    big: list[dict[str, Any]],
) -> str:
    """The section for docs/benchmarks.md from the runs' results."""

    def rate(rs: list[dict[str, Any]], key: str) -> str:
        return spread([r["records"] / r[key] for r in rs], 0)

    def secs(rs: list[dict[str, Any]], key: str) -> str:
        return spread([r[key] for r in rs], 1)

    out = [
        "## Slurm-backed pools: metering sacct records\n\n"
        f"    {command_line('bench.slurm_metering')}\n\n"
        "Each figure is `billing.slurm.meter_day` for one day, as beat's `slurm-meter` task "
        "runs it (`sacct --json` from a stand-in `sacct` that prints the day's synthetic "
        "records, the parser, the ledger writer, billing's `usage_meter`), in a fresh process "
        "on a fresh database; then the same day again (idempotent: it must write nothing). "
        "Every run is checked: the ledger's GPU-seconds equal sacct's allocated GRES × elapsed, "
        "and the re-read leaves every total as it was. Medians, (min–max) over the runs.\n"
    ]
    if args.pairs:
        b, t = pairs["baseline"], pairs["this"]
        ratio = statistics.median(x["first_s"] for x in b) / statistics.median(
            x["first_s"] for x in t
        )
        rows = [
            ["sacct records; usage records written", *(
                f"{rs[0]['records']:,}; {rs[0]['after_first']['usage']:,}" for rs in (b, t)
            ), ""],
            ["first read: records/s", rate(b, "first_s"), rate(t, "first_s"), f"{ratio:.1f}×"],
            ["first read: s", secs(b, "first_s"), secs(t, "first_s"), ""],
            ["re-read (writes nothing): s", secs(b, "again_s"), secs(t, "again_s"), ""],
            ["load average (1 min) after each", *(
                ", ".join(f"{x['load']:.1f}" for x in rs) for rs in (b, t)
            ), ""],
        ]  # fmt: skip
        out.append(
            f"Side by side at {args.pair_records:,} records, alternating, {args.pairs} pairs; "
            f"baseline: commit {args.baseline_rev} (`git archive`), this: the working tree.\n\n"
            + markdown_table(["metering", f"baseline ({args.baseline_rev})", "this", "ratio"], rows)
            + "\n"
        )
    if big:
        rows = [
            ["sacct records (portal jobs)", f"{big[0]['records']:,} ({big[0]['jobs']:,} jobs)"],
            ["allocations written (one per GPU)", f"{big[0]['after_first']['allocations']:,}"],
            ["usage records written (hourly slices)", f"{big[0]['after_first']['usage']:,}"],
            ["first read (`meter_day`): records/s", rate(big, "first_s")],
            ["first read: s", secs(big, "first_s")],
            ["parsing alone (`parse_sacct`, timed apart): s", secs(big, "parse_s")],
            ["re-read of the same day (writes nothing): s", secs(big, "again_s")],
            ["fixtures (jobs, links; not timed): s", secs(big, "fixtures_s")],
            ["load average (1 min) after each", ", ".join(f"{x['load']:.1f}" for x in big)],
        ]
        out.append(
            f"This tree at {args.records:,} records, {len(big)} run(s):\n\n"
            + markdown_table(["metering", "value"], rows)
            + "\n"
        )
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=3, help="runs of this tree at --records")
    ap.add_argument("--baseline-rev", default=BASELINE_REV)
    ap.add_argument("--pair-records", type=int, default=5000)
    ap.add_argument("--pairs", type=int, default=2, help="baseline/this pairs (0: none)")
    ap.add_argument("--no-docs", action="store_true")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker is not None:
        result = measure(args.worker, Path(args.workdir))
        Path(args.out).write_text(json.dumps(result))
        return 0

    pairs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
    big: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-baseline.") as tmp:
        old = baseline_tree(args.baseline_rev, Path(tmp)) if args.pairs else REPO
        for _ in range(args.pairs):
            for label, tree in (("baseline", old), ("this", REPO)):
                r = run_worker(tree, args.pair_records)
                check(r, label)
                pairs[label].append(r)
                print(label, args.pair_records, json.dumps(r), flush=True)
    for _ in range(args.runs):
        r = run_worker(REPO, args.records)
        check(r, "this")
        big.append(r)
        print("this", args.records, json.dumps(r), flush=True)

    text = render(args, pairs, big)
    print(text)
    if not args.no_docs:
        write_section("slurm_metering", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
