"""Slurm-backed pools: hand-off and state latency against a real Slurm.

    .venv/bin/python -m bench.slurm_latency [--rate 10] [--seconds 60] [--processes 2] [--clients 8]

A real, throwaway Slurm cluster (scripts/test-slurm.sh, started here unless SLURM_CONF names
one). Separate processes, as in production (the API's web workers, the cycle's worker, beat's
sync), so that none waits on another's interpreter lock:
- `--processes` submitters offer together `--rate` submits per second for `--seconds`, open
  loop: each submit (`job_submit`, as the API calls it) starts at its due time on one of its
  process's `--clients` threads, whatever the earlier ones are doing (a slow submit delays no
  other);
- the hand-off (the cycle's `submit_queued`: sbatch) runs back to back;
- the state sync (`sync_pool`: squeue/sacct/sinfo) runs back to back.
Reported, p50/p95: submit → Slurm job id recorded on our job (from the submit's answer);
Slurm's start → our job started; Slurm's end → our job ended. Slurm's times are whole seconds,
so the last two carry up to a second of rounding (both ways). In production the sync runs from
beat every 5 s, which adds up to 5 s (2.5 s on average) to the state latencies; the pass time
is reported for that reason. Offered rate: submits over the time from the first due time to
the last submit's start; a submit is late when it started over 100 ms after its due time.

Metering `sacct` records: `bench.slurm_metering`.
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
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench import REPO, command_line, markdown_table, write_section
from bench.django_env import setup, teardown


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
    from scheduler.seed import catalog_seed

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


def _loop(kind: str, pool_id: int, stop: Any, results: Any) -> None:
    """A process running the hand-off or the sync pass back to back until `stop`."""
    from django.db import connections

    from scheduler.backends.slurm.client import Cluster
    from scheduler.backends.slurm.submit import submit_queued
    from scheduler.backends.slurm.sync import sync_pool
    from scheduler.models import Pool

    pool = Pool.objects.get(pk=pool_id)
    times: list[float] = []
    commands: dict[str, list[float]] = {}  # Slurm command → its durations, in this process
    run = Cluster.run

    def timed(self: Cluster, args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return run(self, args, **kwargs)
        finally:
            commands.setdefault(f"{kind}: {args[0]}", []).append(time.perf_counter() - t0)

    Cluster.run = timed  # type: ignore[method-assign]
    try:
        while not stop.is_set():
            t0 = time.perf_counter()
            if kind == "sync":
                sync_pool(pool)
            else:
                submit_queued()
            times.append(time.perf_counter() - t0)
            time.sleep(0.05)
    finally:
        results.put((kind, (times, commands)))
        connections.close_all()


def _submitter(
    part: int,
    user_id: int,
    project_id: int,
    pool_id: int,
    t_start: float,
    args: argparse.Namespace,
    results: Any,
) -> None:
    """One of `args.processes` processes offering, together, `args.rate` submits per second
    from `t_start` (this one every `args.processes`-th), open loop, each on `args.clients`
    threads: a submit starts at its due time, whatever the ones before it are doing."""
    from django.db import connections

    from portal.models import Project, User
    from scheduler.admission import JobSpec, job_submit
    from scheduler.models import GpuModel, Pool

    user = User.objects.get(pk=user_id)
    project = Project.objects.get(pk=project_id)
    pool = Pool.objects.get(pk=pool_id)
    model = GpuModel.objects.get(name="A100-80GB")
    n = int(args.rate * args.seconds)
    done: list[tuple[int, float, float, float]] = []  # job, due, started, answered (epoch)
    lock = threading.Lock()

    def one(i: int, due: float) -> None:
        started = time.time()
        spec = JobSpec(
            name=f"b{i}",
            command=args.command,
            gpus=1,
            gpu_model=model,
            time_limit_s=600,
            pool=pool,
        )
        (job,) = job_submit(actor=user, project=project, spec=spec)
        with lock:
            done.append((job.pk, due, started, time.time()))

    def close_connection() -> None:
        connections.close_all()

    executor = ThreadPoolExecutor(max_workers=args.clients)
    futures = []
    errors: list[str] = []
    try:
        for i in range(part, n, args.processes):
            due = t_start + i / args.rate
            wait = due - time.time()
            if wait > 0:
                time.sleep(wait)
            futures.append(executor.submit(one, i, due))
        for f in futures:
            try:
                f.result()
            except Exception as exc:  # counted and reported, the run goes on
                errors.append(repr(exc)[:200])
        for _ in range(args.clients):  # each client thread's own connection
            executor.submit(close_connection)
        executor.shutdown(wait=True)
    finally:
        results.put(("submits", (done, errors)))
        connections.close_all()


def latency(args: argparse.Namespace) -> tuple[list[list[str]], dict[str, Any]]:
    import multiprocessing

    from django.db import connections

    from scheduler.backends.slurm.client import cluster_for
    from scheduler.backends.slurm.models import SlurmJob
    from scheduler.models import Job, JobEvent, JobState, Pool

    proc, env = start_cluster()
    os.environ.update(env)
    try:
        user, project, pool = seed_pool(env)
        connections.close_all()  # the children open their own
        ctx = multiprocessing.get_context("fork")
        stop = ctx.Event()
        results = ctx.Queue()
        loops = [
            ctx.Process(target=_loop, args=(kind, pool.pk, stop, results))
            for kind in ("handoff", "sync")
        ]
        for loop in loops:
            loop.start()
        t_start = time.time() + 2  # the submitters' processes are up by then
        submitters = [
            ctx.Process(
                target=_submitter,
                args=(k, user.pk, project.pk, pool.pk, t_start, args, results),
            )
            for k in range(args.processes)
        ]
        for sub in submitters:
            sub.start()
        got: dict[str, Any] = {"submits": []}
        errors: list[str] = []
        for _ in submitters:  # the submitters' answers come first (the loops run on)
            kind, (done_, errors_) = results.get(timeout=args.seconds + 600)
            got["submits"] += done_
            errors += errors_
        for sub in submitters:
            sub.join()
        if errors:
            print(f"{len(errors)} submits failed, e.g. {errors[0]}", file=sys.stderr)
        submitted = {job: answered for job, _due, _started, answered in got["submits"]}
        # let Slurm finish what it has (the queue drains at Slurm's pace: 8 GPUs)
        deadline = time.monotonic() + args.drain
        active = [JobState.QUEUED, JobState.SCHEDULED, JobState.STARTING, JobState.RUNNING]
        while time.monotonic() < deadline:
            if not Job.objects.filter(pk__in=submitted, state__in=active).exists():
                break
            time.sleep(1)
        stop.set()
        for _ in loops:
            kind, value = results.get(timeout=120)
            got[kind] = value
        for loop in loops:
            loop.join(timeout=30)
        submits = got["submits"]
        (passes, sync_commands), (handoffs, handoff_commands) = got["sync"], got["handoff"]
        first_due = min(due for _, due, _, _ in submits)
        last_start = max(started for _, _, started, _ in submits)
        offered = len(submits) / (last_start - first_due + 1 / args.rate)
        late = sum(1 for _, due, started, _ in submits if started - due > 0.1)
        call_s = [answered - started for _, _, started, answered in submits]
        # submit → Slurm id: the event that records the sbatch
        to_id = [
            when.timestamp() - submitted[job_id]
            for job_id, when in JobEvent.objects.filter(
                job_id__in=submitted, data__has_key="sbatch"
            ).values_list("job_id", "created_at")
        ]
        p = Pool.objects.get(pk=pool.pk)
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

        def ms(values: list[float]) -> list[str]:
            return [f"{pct(values, 0.5) * 1000:.0f} ms", f"{pct(values, 0.95) * 1000:.0f} ms"]

        def sec(values: list[float]) -> list[str]:
            return [f"{pct(values, 0.5):.2f} s", f"{pct(values, 0.95):.2f} s"]

        rows = [
            ["submit (`job_submit`, the API's call)", f"{len(call_s)}", *ms(call_s)],
            ["submit answered → Slurm job id", f"{len(to_id)}", *ms(to_id)],
            ["Slurm start → started in the portal", f"{len(to_running)}", *sec(to_running)],
            ["Slurm end → ended in the portal", f"{len(to_ended)}", *sec(to_ended)],
            ["sync pass (squeue + sacct + sinfo + writes)", f"{len(passes)}", *ms(passes)],
            ["hand-off pass (sbatch of what is queued)", f"{len(handoffs)}", *ms(handoffs)],
        ]
        for name, values in sorted({**sync_commands, **handoff_commands}.items()):
            rows.append(
                [f"{name} (each call; max {max(values):.1f} s)", f"{len(values)}", *ms(values)]
            )
        info = {
            "errors": len(errors),
            "offered": offered,
            "submitted": len(submits),
            "succeeded": done,
            "late": late,
            "max_late_ms": max(started - due for _, due, started, _ in submits) * 1000,
        }
        return rows, info
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rate", type=float, default=10.0, help="submits per second")
    ap.add_argument("--seconds", type=float, default=60.0, help="how long to submit")
    ap.add_argument("--processes", type=int, default=2, help="submitting processes")
    ap.add_argument("--clients", type=int, default=8, help="threads per submitting process")
    ap.add_argument("--drain", type=float, default=240.0, help="wait at most this for Slurm")
    ap.add_argument("--command", default="true", help="what each job runs")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    setup("slurm_bench")
    try:
        rows, info = latency(args)
    finally:
        teardown()
    table = markdown_table(["latency", "count", "p50", "p95"], rows)
    text = (
        "## Slurm-backed pools: hand-off and state latency\n\n"
        f"    {command_line('bench.slurm_latency')}\n\n"
        f"Offered {info['offered']:.2f} submits/s ({info['submitted']} one-GPU jobs of "
        f"`{args.command}` over {args.seconds:.0f} s, {args.processes} submitting processes of "
        f"{args.clients} threads; "
        f"{info['late']} submits started over 100 ms late, the latest "
        f"{info['max_late_ms']:.0f} ms; {info['errors']} failed) on the throwaway two-node cluster (8 A100 GRES); "
        f"{info['succeeded']} succeeded within the drain time.\n\n{table}\n"
    )
    print(text)
    if not args.no_docs:
        write_section("slurm_latency", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
