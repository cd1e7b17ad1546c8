"""Telemetry ingest benchmark: sustained GPU samples per second, chart latency under that load.

    .venv/bin/python bench/telemetry_ingest.py --nodes 2500 --gpus 8 --producers 2 --seconds 30

What it does, against the local PostgreSQL and Redis (its own database `gpuportal_bench` and
Redis db 14, so it never touches the dev or test data):

1. builds a fleet of N nodes × G GPUs, half of the nodes running one G-GPU job (once; reused);
2. K producer processes call the real sink (`monitoring.ingest.ingest_samples`) heartbeat by
   heartbeat, as fast as they can, for S seconds. A heartbeat carries B samples per GPU (the
   agent samples at 1 Hz and sends every B seconds; `--batch`, default 5 = the default 5 s
   heartbeat), each with its own `age_s`; meanwhile a churn process ends and starts jobs on
   random nodes (`--churn` per second) through the real transitions, so the sink's attribution
   cache is invalidated and re-read as it would be in a live fleet;
3. meanwhile one process requests the chart endpoints through Django's test client (DRF, auth,
   JSON) and records latencies: node series (15 min, from the live window), job series, and
   the cluster overview (every GPU);
4. then flushes the raw samples into 1-minute rollups (timed) and runs `redis-benchmark` for
   the ceiling of this Redis on this machine;
5. prints a table and, with --write-docs, replaces the "## Benchmark" section of
   docs/monitoring.md and the telemetry section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/gpuportal_bench")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/14")
os.environ.setdefault("MONITORING_KEY_PREFIX", "bench-mon")


def ensure_database() -> None:
    import psycopg

    url = os.environ["DATABASE_URL"]
    base, name = url.rsplit("/", 1)
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def setup_django() -> None:
    import django

    django.setup()


def build_fleet(nodes: int, gpus: int) -> None:
    """N nodes × G GPUs; every other node runs one job holding all its GPUs."""
    from django.core.management import call_command
    from django.db import connection

    from scheduler.models import Node

    call_command("migrate", verbosity=0)
    if Node.objects.filter(name__startswith="bench-").count() == nodes:
        return
    _build(nodes, gpus)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # fresh statistics, as autovacuum would give a live database


def _build(nodes: int, gpus: int) -> None:
    from django.utils import timezone

    from portal.models import Project, User
    from portal.services import project_create
    from scheduler.models import Allocation, Gpu, GpuModel, Job, JobState, Node, Pool
    from scheduler.seed import catalog_seed

    Allocation.objects.filter(node__name__startswith="bench-").delete()
    Job.objects.filter(name="bench").delete()
    Node.objects.filter(name__startswith="bench-").delete()
    catalog_seed()
    model = GpuModel.objects.get(name="H100-80GB-SXM")
    pool, _ = Pool.objects.get_or_create(name="bench")
    rows = Node.objects.bulk_create(
        [
            Node(
                name=f"bench-{i:05d}",
                pool=pool,
                state=Node.State.READY,
                cpu_milli=128_000,
                memory_mib=1_000_000,
            )
            for i in range(nodes)
        ],
        batch_size=2000,
    )
    Gpu.objects.bulk_create(
        [
            Gpu(node=n, index=j, uuid=f"GPU-bench-{n.pk}-{j}", model=model, memory_mib=81_559)
            for n in rows
            for j in range(gpus)
        ],
        batch_size=5000,
    )
    user = User.objects.filter(email="bench@example.org").first() or User.objects.create_user(
        "bench@example.org", "bench-pw-123", is_staff=True
    )
    project = Project.objects.filter(slug="bench").first() or project_create(
        owner=user, slug="bench", name="Bench"
    )
    now = timezone.now()
    busy = rows[::2]
    jobs = Job.objects.bulk_create(
        [
            Job(
                project=project,
                submitted_by=user,
                name="bench",
                command="true",
                state=JobState.RUNNING,
                gpus=gpus,
                gpu_model=model,
                attempt=1,
            )
            for _ in busy
        ],
        batch_size=2000,
    )
    by_node = {}
    for gpu in Gpu.objects.filter(node__in=busy).only("pk", "node_id"):
        by_node.setdefault(gpu.node_id, []).append(gpu.pk)
    Allocation.objects.bulk_create(
        [
            Allocation(
                job=job,
                gpu_id=gpu_id,
                node=node,
                attempt=1,
                share_milli=1000,
                gpu_model=model,
                started_at=now,
            )
            for job, node in zip(jobs, busy, strict=True)
            for gpu_id in by_node[node.pk]
        ],
        batch_size=5000,
    )


def fleet_layout() -> tuple[list[tuple[int, list[tuple[int, str]]]], list[int], int]:
    from scheduler.models import Gpu, Job, JobState, Node

    nodes: dict[int, list[tuple[int, str]]] = {}
    for pk, node_id, uuid in (
        Gpu.objects.filter(node__name__startswith="bench-")
        .order_by("node_id", "index")
        .values_list("pk", "node_id", "uuid")
    ):
        nodes.setdefault(node_id, []).append((pk, uuid))
    jobs = list(
        Job.objects.filter(name="bench", state=JobState.RUNNING).values_list("pk", flat=True)[:200]
    )
    first_node = Node.objects.filter(name__startswith="bench-").order_by("pk").first()
    assert first_node is not None
    return list(nodes.items()), jobs, first_node.pk


class NodeRef:
    """What the sink needs of a node: its primary key."""

    def __init__(self, pk: int) -> None:
        self.pk = pk


def producer(slice_: list, seconds: float, start_at: float, batch: int, out: mp.Queue) -> None:
    setup_django()
    from django.db import connection
    from django.utils import timezone

    from monitoring import ingest
    from monitoring.ingest import ingest_samples

    connection.close()
    rnd = random.Random(os.getpid())
    while time.time() < start_at:
        time.sleep(0.005)
    end = start_at + seconds
    count = calls = 0
    i = 0
    while time.time() < end:
        node_id, gpus = slice_[i % len(slice_)]
        i += 1
        samples = [
            {
                "gpu_id": pk,
                "uuid": uuid,
                "utilization": float(rnd.randint(0, 100)),
                "memory_used_mib": rnd.randint(0, 80_000),
                "temperature_c": float(rnd.randint(30, 80)),
                "power_w": float(rnd.randint(60, 700)),
                "xid_events": [],
                "age_s": float(age),
            }
            for age in range(batch - 1, -1, -1)
            for pk, uuid in gpus
        ]
        ingest_samples(node=NodeRef(node_id), samples=samples, now=timezone.now())
        count += len(samples)
        calls += 1
    out.put((count, calls, time.time() - start_at, ingest.stats["reads"]))


def churn(per_s: float, seconds: float, start_at: float, out: mp.Queue) -> None:
    """End a running bench job and start a new one on its GPUs, `per_s` times a second."""
    setup_django()
    from django.db import connection, transaction
    from django.utils import timezone

    from scheduler.models import Allocation, Job, JobState
    from scheduler.transitions import job_transition

    connection.close()
    rnd = random.Random(7)
    running = list(
        Job.objects.filter(name="bench", state=JobState.RUNNING).values_list("pk", flat=True)
    )
    while time.time() < start_at:
        time.sleep(0.005)
    end, done = start_at + seconds, 0
    while per_s > 0 and time.time() < end:
        due = start_at + done / per_s
        if time.time() < due:
            time.sleep(min(0.05, due - time.time()))
            continue
        idx = rnd.randrange(len(running))
        with transaction.atomic():
            job = Job.objects.select_for_update().get(pk=running[idx])
            allocs = list(Allocation.objects.filter(job=job, ended_at__isnull=True))
            job_transition(job=job, to=JobState.SUCCEEDED, reason="bench churn")
            job.pk = None
            job.state, job.started_at, job.finished_at = JobState.RUNNING, None, None
            job.save()
            now = timezone.now()
            for a in allocs:  # each save bumps the node's allocation generation
                a.pk, a.job, a.started_at, a.ended_at, a.end_reason = None, job, now, None, ""
                a.save()
        running[idx] = job.pk
        done += 1
    out.put(done)


def querier(
    node_ids: list[int], job_ids: list[int], seconds: float, start_at: float, out: mp.Queue
) -> None:
    setup_django()
    from django.db import connection
    from django.test import Client
    from django.test.utils import setup_test_environment

    from portal.models import User

    connection.close()
    setup_test_environment()
    client = Client()
    client.force_login(User.objects.get(email="bench@example.org"))
    while time.time() < start_at + 2:  # let the window fill a little
        time.sleep(0.01)
    timings: dict[str, list[float]] = {"node": [], "job": [], "cluster": []}
    end = start_at + seconds
    rnd = random.Random(1)
    n = 0
    while time.time() < end:
        n += 1
        if n % 10 == 0:
            kind, url = "cluster", "/api/v1/monitoring/cluster?range=15m"
        elif n % 2:
            kind, url = "node", f"/api/v1/monitoring/nodes/{rnd.choice(node_ids)}/series?range=15m"
        else:
            kind, url = "job", f"/api/v1/monitoring/jobs/{rnd.choice(job_ids)}/series?range=15m"
        t0 = time.perf_counter()
        resp = client.get(url)
        timings[kind].append((time.perf_counter() - t0) * 1000)
        assert resp.status_code == 200, (url, resp.status_code)
    out.put(timings)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def redis_ceiling() -> dict[str, float]:
    out = {}
    for pipeline in (1, 16):
        try:
            res = subprocess.run(
                [
                    "redis-benchmark",
                    "-t",
                    "set,get",
                    "-n",
                    "200000",
                    "-P",
                    str(pipeline),
                    "-q",
                    "--csv",
                ],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        for line in res.stdout.splitlines():
            parts = [p.strip('"') for p in line.split(",")]
            if parts and parts[0] in ("SET", "GET"):
                out[f"{parts[0]} -P {pipeline}"] = float(parts[1])
    return out


def one_run(
    args: argparse.Namespace, layout: list, node_ids: list[int], job_ids: list[int]
) -> dict:
    """One measurement: producers, churn and the chart client for `--seconds`, then the flush."""
    from django.db import connection
    from django.utils import timezone

    from monitoring import live
    from monitoring.rollups import flush_rollups

    live.clear()
    connection.close()
    ctx = mp.get_context("fork")
    results: mp.Queue = ctx.Queue()
    timings_q: mp.Queue = ctx.Queue()
    churn_q: mp.Queue = ctx.Queue()
    start_at = time.time() + 2.0
    procs = [
        ctx.Process(
            target=producer,
            args=(layout[k :: args.producers], args.seconds, start_at, args.batch, results),
        )
        for k in range(args.producers)
    ]
    procs.append(ctx.Process(target=churn, args=(args.churn, args.seconds, start_at, churn_q)))
    if not args.no_query:
        procs.append(
            ctx.Process(target=querier, args=(node_ids, job_ids, args.seconds, start_at, timings_q))
        )
    for p in procs:
        p.start()
    produced = [results.get() for _ in range(args.producers)]
    timings = timings_q.get() if not args.no_query else {"node": [], "job": [], "cluster": []}
    churned = churn_q.get()
    for p in procs:
        p.join()
    samples = sum(r[0] for r in produced)
    elapsed = max(r[2] for r in produced)
    t0 = time.perf_counter()
    flushed = flush_rollups(now=timezone.now() + timezone.timedelta(minutes=2))
    flush_s = time.perf_counter() - t0
    return {
        "rate": samples / elapsed,
        "heartbeats": sum(r[1] for r in produced) / elapsed,
        "reads": sum(r[3] for r in produced),
        "samples": samples,
        "churn": churned / elapsed,
        "flush_s": flush_s,
        "flush_rate": flushed / flush_s if flush_s else 0.0,
        "timings": timings,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=2500)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--batch", type=int, default=5, help="samples per GPU per heartbeat")
    parser.add_argument("--churn", type=float, default=5.0, help="jobs replaced per second")
    parser.add_argument("--runs", type=int, default=1, help="medians over this many runs")
    parser.add_argument("--no-query", action="store_true", help="ingest only")
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()

    ensure_database()
    setup_django()
    build_fleet(args.nodes, args.gpus)
    layout, job_ids, _first = fleet_layout()
    node_ids = [n for n, _g in layout]
    runs = [one_run(args, layout, node_ids, job_ids) for _ in range(args.runs)]
    ceiling = redis_ceiling()

    from bench import machine, spread

    host = machine()

    def med(name: str) -> float:
        return statistics.median(r[name] for r in runs)

    def spr(name: str, digits: int = 0) -> str:
        return spread([r[name] for r in runs], digits)

    cpus = os.cpu_count()
    command = (
        f".venv/bin/python bench/telemetry_ingest.py --nodes {args.nodes} --gpus {args.gpus} "
        f"--producers {args.producers} --seconds {args.seconds:g} --batch {args.batch} "
        f"--churn {args.churn:g} --runs {args.runs}"
    )
    per_run = ", ".join(f"{r['rate']:,.0f}" for r in runs)
    lines = [
        f"Fleet: {args.nodes} nodes × {args.gpus} GPUs ({args.nodes * args.gpus} GPUs, half held "
        f"by running jobs); {args.producers} producer processes for {args.seconds:g} s, each "
        f"heartbeat carrying {args.batch} samples per GPU (1 Hz sampling, "
        f"{args.batch} s heartbeat); {args.churn:g} jobs ended and replaced per second; "
        f"medians of {args.runs} run(s), with their min–max; {cpus} CPUs, PostgreSQL and Redis "
        "local.",
        "",
        "| measure | value |",
        "|---|---|",
        f"| ingest, sustained (GPU samples/s) | **{med('rate'):,.0f}** (target ≥ 20,000; runs: {per_run}) |",
        f"| heartbeats/s (one Redis script each) | {spr('heartbeats')} |",
        f"| attribution reads from PostgreSQL (first sight of a node, or its allocations changed) | {spr('reads')} per run |",
        f"| jobs ended and started meanwhile (per s) | {spr('churn', 1)} |",
        f"| samples ingested (per run) | {spr('samples')} |",
        f"| minute-rollup flush of those samples | {spr('flush_s', 2)} s ({spr('flush_rate')} samples/s) |",
    ]
    for kind, label in (
        ("node", "node chart (8 GPUs, 15 min, live window)"),
        ("job", "job chart (its GPUs, 15 min)"),
        ("cluster", f"cluster overview ({args.nodes * args.gpus} GPUs heatmap + charts)"),
    ):
        p50s = [statistics.median(r["timings"][kind]) for r in runs if r["timings"].get(kind)]
        p95s = [pct(r["timings"][kind], 0.95) for r in runs if r["timings"].get(kind)]
        n = sum(len(r["timings"].get(kind, [])) for r in runs)
        if p50s:
            lines.append(
                f"| {label}: p50 / p95 under load (ms, n={n}; medians of the runs' p50 and p95, "
                f"p95 min–max) | {statistics.median(p50s):.1f} / {spread(p95s)} |"
            )
    for name, ops in ceiling.items():
        lines.append(f"| redis-benchmark {name} (ops/s, ceiling) | {ops:,.0f} |")
    section = "\n".join(lines) + "\n\n" + host
    print(section)
    print(f"\ncommand: {command}")
    if args.write_docs:
        doc = ROOT / "docs" / "monitoring.md"
        text = doc.read_text() if doc.exists() else "# Monitoring\n"
        block = f"## Benchmark\n\n```\n{command} --write-docs\n```\n\n{section}\n"
        if "## Benchmark" in text:
            head, rest = text.split("## Benchmark", 1)
            tail = rest.split("\n## ", 1)
            text = head + block + ("\n## " + tail[1] if len(tail) > 1 else "")
        else:
            text = text.rstrip() + "\n\n" + block
        doc.write_text(text)
        from bench import write_section

        write_section(
            "telemetry_ingest",
            "## Telemetry ingest and chart queries (from docs/monitoring.md)\n\n"
            f"```\n{command} --write-docs\n```\n\n{section}\n",
        )
        print(f"wrote {doc} and docs/benchmarks.md")


if __name__ == "__main__":
    main()
