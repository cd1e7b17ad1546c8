"""Slurm-backed pools: hand-off and state latency against a real Slurm, and sacct metering.

    .venv/bin/python -m bench.slurm_latency [--rate 10] [--seconds 60] [--records 100000]

Part 1 (a real, throwaway Slurm cluster: scripts/test-slurm.sh, started here unless SLURM_CONF
names one): jobs are submitted through the portal's service (`job_submit`, as the API does) at
`--rate` per second for `--seconds`; the hand-off (the cycle's `submit_queued`, sbatch) and the
state sync (`sync_pool`: squeue/sacct/sinfo) each run back to back in a thread of their own.
Reported, p50/p95: submit → Slurm job id recorded on our job; Slurm's start → our job running;
Slurm's end → our job ended. Slurm's times are whole seconds, so the last two carry up to a
second of rounding (both ways). In production the sync runs from beat every 5 s, which adds up
to 5 s (2.5 s on average) to the state latencies; the pass time is reported for that reason.

Part 2 (no cluster): `--records` synthetic `sacct --json` job records (1-8 A100s, 5 min to 3 h,
some requeued twice) for as many portal jobs, through the real parser (`parse_sacct`) and the
ledger writer (`write_runs`: allocations, then billing's `usage_meter`), then the same records
again (must write nothing). Baseline: billing's own metering of the same allocations, as the
anchor for what the Slurm side adds.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import REPO, command_line, markdown_table, write_section
from bench.django_env import reset, setup, teardown


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def start_cluster() -> tuple[subprocess.Popen[str] | None, dict[str, str]]:
    if os.environ.get("SLURM_CONF"):
        return None, {
            "SLURM_CONF": os.environ["SLURM_CONF"],
            "PORTAL_TEST_SLURM_SHARED": os.environ.get("PORTAL_TEST_SLURM_SHARED", "/tmp"),
        }
    base = tempfile.mkdtemp(prefix="bench-slurm.")
    proc = subprocess.Popen(
        ["bash", str(REPO / "scripts" / "test-slurm.sh"), base],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    env: dict[str, str] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.match(r"export (.*)", line.strip())
        if m:
            for pair in m.group(1).split():
                k, _, v = pair.partition("=")
                env[k] = v
            break
    if not env.get("SLURM_CONF") or proc.poll() is not None:
        raise SystemExit("the throwaway Slurm cluster did not start (scripts/test-slurm.sh)")
    return proc, env


def seed_pool(env: dict[str, str]) -> tuple[Any, Any, Any]:
    from portal.models import User
    from portal.services import project_create
    from scheduler.backends.slurm.models import SlurmPool
    from scheduler.backends.slurm.nodes import sync_nodes
    from scheduler.models import Pool, Quota
    from scheduler.services import catalog_seed

    catalog_seed()
    user = User.objects.create_user("bench@example.org", "x")
    project = project_create(owner=user, slug="bench", name="Bench")
    Quota.objects.filter(project=project).update(max_gpus=None, max_gpus_per_job=8)
    pool = Pool.objects.create(name="hpc", backend=Pool.Backend.SLURM)
    cluster = re.search(r"ClusterName=(\S+)", Path(env["SLURM_CONF"]).read_text())
    SlurmPool.objects.create(
        pool=pool,
        cluster_name=cluster.group(1) if cluster else "bench",
        conf_path=env["SLURM_CONF"],
        gpu_types={"A100-80GB": "a100"},
        output_dir=env.get("PORTAL_TEST_SLURM_SHARED") or "/tmp",
    )
    sync_nodes(pool)
    return user, project, pool


def latency(args: argparse.Namespace) -> tuple[list[list[str]], dict[str, Any]]:
    from django.db import connection

    from portal.models import Project, User
    from scheduler.admission import JobSpec, job_submit
    from scheduler.backends.slurm.models import SlurmJob
    from scheduler.backends.slurm.submit import submit_queued
    from scheduler.backends.slurm.sync import sync_pool
    from scheduler.models import GpuModel, Job, JobEvent, JobState, Pool

    proc, env = start_cluster()
    os.environ.update(env)
    try:
        user, project, pool = seed_pool(env)
        model = GpuModel.objects.get(name="A100-80GB")
        submitted: dict[int, float] = {}
        stop = threading.Event()
        passes: list[float] = []
        handoffs: list[float] = []

        def loop(fn: Any, times: list[float]) -> None:
            try:
                while not stop.is_set():
                    t0 = time.perf_counter()
                    fn()
                    times.append(time.perf_counter() - t0)
                    time.sleep(0.05)
            finally:
                connection.close()

        p = Pool.objects.get(pk=pool.pk)
        threads = [
            threading.Thread(target=loop, args=(submit_queued, handoffs), daemon=True),
            threading.Thread(target=loop, args=(lambda: sync_pool(p), passes), daemon=True),
        ]
        for t in threads:
            t.start()
        u = User.objects.get(pk=user.pk)
        pr = Project.objects.get(pk=project.pk)
        t_start = time.perf_counter()
        n = int(args.rate * args.seconds)
        late = 0
        for i in range(n):
            due = t_start + i / args.rate
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            else:
                late += 1
            spec = JobSpec(
                name=f"b{i}",
                command=args.command,
                gpus=1,
                gpu_model=model,
                time_limit_s=600,
                pool=p,
            )
            (job,) = job_submit(actor=u, project=pr, spec=spec)
            submitted[job.pk] = time.time()
        offered = n / (time.perf_counter() - t_start)
        # let Slurm finish what it has (the queue drains at Slurm's pace: 8 GPUs)
        deadline = time.monotonic() + args.drain
        while time.monotonic() < deadline:
            if not Job.objects.filter(
                pk__in=submitted,
                state__in=[
                    JobState.QUEUED,
                    JobState.SCHEDULED,
                    JobState.STARTING,
                    JobState.RUNNING,
                ],
            ).exists():
                break
            time.sleep(1)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        # submit → Slurm id: the link's creation (the event that records the sbatch)
        to_id = []
        for job_id, when in JobEvent.objects.filter(
            job_id__in=submitted, data__has_key="sbatch"
        ).values_list("job_id", "created_at"):
            to_id.append(when.timestamp() - submitted[job_id])
        from scheduler.backends.slurm.client import cluster_for

        acct = cluster_for(p).sacct(
            start=(datetime.now(UTC) - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%S"),
            end=(datetime.now(UTC) + timedelta(minutes=5)).strftime("%Y-%m-%dT%H:%M:%S"),
        )
        slurm_times = {str(r["job_id"]): (r["time"]["start"], r["time"]["end"]) for r in acct}
        links = dict(
            SlurmJob.objects.filter(job_id__in=submitted).values_list("job_id", "slurm_job_id")
        )
        to_running, to_ended = [], []
        events = JobEvent.objects.filter(job_id__in=submitted).values_list(
            "job_id", "to_state", "created_at"
        )
        seen_running: dict[int, float] = {}  # the first sign of the start: scheduled, or later
        seen_end: dict[int, float] = {}
        started = (JobState.SCHEDULED, JobState.RUNNING, JobState.SUCCEEDED, JobState.FAILED)
        for job_id, to_state, at in events.order_by("pk"):
            if to_state in started:
                seen_running.setdefault(job_id, at.timestamp())
            if to_state in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
                seen_end[job_id] = at.timestamp()
        for job_id, sid in links.items():
            start, end = slurm_times.get(sid, (0, 0))
            if start and job_id in seen_running:
                to_running.append(seen_running[job_id] - start)
            if end and job_id in seen_end:
                to_ended.append(seen_end[job_id] - end)
        done = Job.objects.filter(pk__in=submitted, state=JobState.SUCCEEDED).count()
        rows = [
            [
                "submit → Slurm job id",
                f"{len(to_id)}",
                f"{pct(to_id, 0.5) * 1000:.0f} ms",
                f"{pct(to_id, 0.95) * 1000:.0f} ms",
            ],
            [
                "Slurm start → started in the portal",
                f"{len(to_running)}",
                f"{pct(to_running, 0.5):.2f} s",
                f"{pct(to_running, 0.95):.2f} s",
            ],
            [
                "Slurm end → ended in the portal",
                f"{len(to_ended)}",
                f"{pct(to_ended, 0.5):.2f} s",
                f"{pct(to_ended, 0.95):.2f} s",
            ],
            [
                "sync pass (squeue + sacct + sinfo + writes)",
                f"{len(passes)}",
                f"{pct(passes, 0.5) * 1000:.0f} ms",
                f"{pct(passes, 0.95) * 1000:.0f} ms",
            ],
            [
                "hand-off pass (sbatch of what is queued)",
                f"{len(handoffs)}",
                f"{pct(handoffs, 0.5) * 1000:.0f} ms",
                f"{pct(handoffs, 0.95) * 1000:.0f} ms",
            ],
        ]
        info = {"offered": offered, "submitted": n, "succeeded": done, "late": late}
        return rows, info
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def synthetic_sacct(job_links: list[tuple[int, str]], seed: int = 7) -> list[dict[str, Any]]:
    import random

    rng = random.Random(seed)
    day = datetime(2026, 11, 3, tzinfo=UTC).timestamp()
    records = []
    for i, (_job, sid) in enumerate(job_links):
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


def metering(args: argparse.Namespace) -> tuple[list[list[str]], dict[str, Any]]:
    from django.db import connection

    from billing.models import UsageRecord
    from billing.services import usage_meter
    from billing.slurm import parse_sacct, write_runs
    from portal.models import User
    from portal.services import project_create
    from scheduler.backends.slurm.models import SlurmJob, SlurmPool
    from scheduler.models import Allocation, Gpu, GpuModel, Job, JobState, Node, Pool
    from scheduler.services import catalog_seed

    catalog_seed()
    user = User.objects.create_user("meter@example.org", "x")
    project = project_create(owner=user, slug="bench", name="Bench")
    pool = Pool.objects.create(name="hpc", backend=Pool.Backend.SLURM)
    SlurmPool.objects.create(
        pool=pool,
        cluster_name="bench",
        conf_path="/nonexistent/slurm.conf",
        gpu_types={"A100-80GB": "a100"},
        output_dir="/tmp",
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
    t0 = time.perf_counter()
    n_jobs = args.records * 50 // 52  # every 50th job has three runs: records ≈ --records
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
    now = datetime(2026, 11, 4, tzinfo=UTC)
    SlurmJob.objects.bulk_create(
        [
            SlurmJob(job=j, pool=pool, slurm_job_id=str(100_000 + i), submitted_at=now)
            for i, j in enumerate(jobs)
        ],
        batch_size=5000,
    )
    records = synthetic_sacct([(j.pk, str(100_000 + i)) for i, j in enumerate(jobs)])
    fixtures = time.perf_counter() - t0
    chunk = 10_000

    def run_all() -> tuple[float, float, int, int]:
        parse_s = write_s = 0.0
        created = usage = 0
        # a day of a big cluster arrives in pieces (one sacct call per chunk of job ids)
        by_job: dict[int, list[dict[str, Any]]] = {}
        for r in records:
            by_job.setdefault(r["job_id"], []).append(r)
        ids = list(by_job)
        for k in range(0, len(ids), chunk):
            part = [r for i in ids[k : k + chunk] for r in by_job[i]]
            a = time.perf_counter()
            runs = parse_sacct({"jobs": part})
            b = time.perf_counter()
            result = write_runs(pool, runs, now=now)
            c = time.perf_counter()
            parse_s += b - a
            write_s += c - b
            created += result.allocations_created
            usage += result.meter.records
        return parse_s, write_s, created, usage

    parse1, write1, created1, usage1 = run_all()
    total_usage = UsageRecord.objects.count()
    parse2, write2, created2, usage2 = run_all()
    assert created2 == 0 and usage2 == 0 and UsageRecord.objects.count() == total_usage
    # anchor: billing's own metering of the same allocations, from scratch
    from billing.models import AllocationMeter

    with connection.cursor() as cur:
        cur.execute("DELETE FROM billing_usagerecord")
    AllocationMeter.objects.all().delete()
    a = time.perf_counter()
    usage_meter(now=now, allocation_ids=list(Allocation.objects.values_list("pk", flat=True)))
    plain = time.perf_counter() - a
    n_rec = len(records)
    rows = [
        ["sacct records (portal jobs)", f"{n_rec:,} ({n_jobs:,} jobs)", ""],
        ["allocations written (one per GPU)", f"{created1:,}", ""],
        ["usage records written (hourly slices)", f"{usage1:,}", ""],
        ["parse (`parse_sacct`)", f"{parse1:.1f} s", f"{n_rec / parse1:,.0f} records/s"],
        [
            "ledger write (`write_runs`: allocations + usage_meter)",
            f"{write1:.1f} s",
            f"{n_rec / write1:,.0f} records/s",
        ],
        [
            "anchor: billing's usage_meter alone, same allocations",
            f"{plain:.1f} s",
            f"{(write1 / plain):.2f}× of it is the Slurm write",
        ],
        [
            "re-reading the same records (idempotent)",
            f"{parse2 + write2:.1f} s",
            f"{created2} allocations, {usage2} usage records written",
        ],
        ["fixtures (jobs, links; not timed)", f"{fixtures:.1f} s", ""],
    ]
    return rows, {"records": n_rec}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=10.0, help="submits per second")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to submit")
    ap.add_argument("--drain", type=float, default=240.0, help="wait at most this for Slurm")
    ap.add_argument("--command", default="true", help="what each job runs")
    ap.add_argument("--records", type=int, default=100_000)
    ap.add_argument("--skip-latency", action="store_true")
    ap.add_argument("--skip-metering", action="store_true")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    setup("slurm_bench")
    out = [
        f"## Slurm-backed pools: hand-off, state latency, sacct metering\n\n    {command_line('bench.slurm_latency')}\n"
    ]
    try:
        if not args.skip_latency:
            rows, info = latency(args)
            table = markdown_table(["latency", "jobs", "p50", "p95"], rows)
            print(table)
            print(info)
            out.append(
                f"Submitting {info['submitted']} one-GPU jobs (`{args.command}`) at "
                f"{info['offered']:.1f}/s for {args.seconds:.0f} s ({info['late']} submits "
                f"started late) on the throwaway two-node cluster (8 A100 GRES); "
                f"{info['succeeded']} succeeded within the drain time.\n\n{table}\n"
            )
            reset()
        if not args.skip_metering:
            rows, info = metering(args)
            table = markdown_table(["metering", "value", "rate"], rows)
            print(table)
            out.append(f"Metering synthetic `sacct --json` records:\n\n{table}\n")
    finally:
        teardown()
    if not args.no_docs:
        write_section("slurm_latency", "\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
