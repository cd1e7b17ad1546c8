"""PostgreSQL CPU per run of the worker's event tasks, the capacity model's missing PG terms.

    .venv/bin/python -m bench.worker_task_pg [--reps 200] [--runs 3]

Run after `bench.load`, with DATABASE_URL naming the database it used (`<name>_load`) (its jobs, nodes and users are the fixtures): in this
process, each rep calls the task's body inside a transaction that is rolled back:

- job notices: `job_notices_send` with one event (a job's start or its success, alternating, on
  the run's jobs), as the worker's `scheduler.job_notices` gets about one per batch;
- model availability: `model_availability_refresh` (the queue and fleet as the run left them).

Measured per rep: this process's CPU (the task's Python) and its own PostgreSQL backend's CPU
(from /proc). Medians of runs (min–max).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from bench import command_line, markdown_table, spread, write_section


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")  # mail kept in memory
    import django

    django.setup()
    from django.db import transaction

    from bench.endpoint_cost import own_backend_cpu
    from portal.models import NoticeKind
    from scheduler.estimates import model_availability_refresh
    from scheduler.job_notices import job_notices_send
    from scheduler.models import Job

    jobs = list(Job.objects.order_by("-pk").values_list("pk", flat=True)[: args.reps])
    if not jobs:
        raise SystemExit("no jobs: run bench.load on this database first")
    kinds = [NoticeKind.JOB_STARTED, NoticeKind.JOB_SUCCEEDED]

    def notice(i: int) -> None:
        job_notices_send(events=[[jobs[i % len(jobs)], str(kinds[i % 2]), ""]])

    def availability(_i: int) -> None:
        model_availability_refresh()

    tasks = {
        "scheduler.job_notices": (notice, args.reps),
        "scheduler.model_availability_refresh": (availability, max(1, args.reps // 10)),
    }
    results: dict[str, dict[str, list[float]]] = {k: {"cpu": [], "pg": []} for k in tasks}
    for _ in range(args.runs):
        for name, (fn, reps) in tasks.items():
            cpu = pg = 0.0
            for i in range(reps):
                with transaction.atomic():
                    c0, p0 = time.process_time(), own_backend_cpu()
                    fn(i)
                    cpu += time.process_time() - c0
                    pg += own_backend_cpu() - p0
                    transaction.set_rollback(True)
            results[name]["cpu"].append(cpu * 1000 / reps)
            results[name]["pg"].append(pg * 1000 / reps)
            print(name, f"cpu {cpu * 1000 / reps:.2f} ms", f"pg {pg * 1000 / reps:.2f} ms")
    prices = {k: statistics.median(v["pg"]) for k, v in results.items()}
    rows = [
        [f"`{k}`", str(tasks[k][1]), spread(v["cpu"], 1), spread(v["pg"], 2)]
        for k, v in results.items()
    ]
    body = (
        "## PostgreSQL CPU per run of the worker's event tasks (the capacity model's worker PG)\n\n"
        f"`{command_line('bench.worker_task_pg')}` — on the database `bench.load` (section "
        "`load_scaled`) left: each rep the task's body in this process, in a transaction rolled "
        "back; this process's CPU and its own PostgreSQL backend's CPU (/proc) per rep; medians "
        f"of {args.runs} runs (min–max). One event per notice batch.\n\n"
        + markdown_table(["task", "reps per run", "task CPU ms", "PostgreSQL CPU ms"], rows)
        + f"\n\n<!-- worker_task_pg:data {json.dumps({'pg_ms': prices})} -->\n"
    )
    print(body)
    if not args.no_docs:
        write_section("worker_task_pg", body)


if __name__ == "__main__":
    main()
