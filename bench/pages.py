"""Page latency with a long history: the dashboard, a job's page and the submit form, with
10,000 jobs in the project's history, against the same pages with 100 jobs (the baseline,
run side by side in the same process and database server).

.venv/bin/python -m bench.pages [--history 10000] [--baseline 100] [--requests 60]

Builds a throwaway PostgreSQL database (`<name>_pages`), a fleet of 8 nodes × 8 GPUs, and two
projects owned by one researcher: `big` with `--history` jobs (90 % finished, the rest queued
or running with their GPUs, ten events each for the job whose page is timed) and `small` with
`--baseline`. Each page is requested through Django's test client (the whole middleware stack,
a logged-in session, templates rendered) `--requests` times after 5 warm-up requests; the
table gives p50 and p95 in ms and the ratio of the p95s. Target: p95 under 300 ms at 10,000.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench import command_line, markdown_table, write_section
from bench.django_env import setup, teardown

TARGET_P95_MS = 300.0


def build(slug: str, jobs: int, owner: object) -> dict[str, int]:
    from django.utils import timezone

    from portal.services import project_create
    from scheduler.models import Allocation, Gpu, GpuModel, Job, JobEvent, JobState

    project = project_create(owner=owner, slug=slug, name=slug.title())  # type: ignore[arg-type]
    model = GpuModel.objects.get(name="H100-80GB-SXM")
    now = timezone.now()
    states = [JobState.SUCCEEDED] * 7 + [JobState.FAILED, JobState.CANCELLED, JobState.QUEUED]
    rows = [
        Job(
            project=project,
            submitted_by=owner,
            name=f"{slug}-{i}",
            command="python train.py --epochs 10",
            state=states[i % len(states)],
            gpu_model=model,
            gpus=1 + i % 4,
            queued_at=now,
            started_at=now if states[i % len(states)] != JobState.QUEUED else None,
            finished_at=now
            if states[i % len(states)] in (JobState.SUCCEEDED, JobState.FAILED)
            else None,
            pending_reason="no_capacity" if states[i % len(states)] == JobState.QUEUED else "",
        )
        for i in range(jobs)
    ]
    created = Job.objects.bulk_create(rows, batch_size=2000)
    # a few running jobs holding GPUs (the dashboard's "my active jobs")
    gpus = list(Gpu.objects.filter(model=model).select_related("node").order_by("pk"))
    running = []
    for job, gpu in zip(created[: len(gpus) // 2 : 10], gpus, strict=False):
        job.state = JobState.RUNNING
        job.finished_at = None
        running.append(job)
        Allocation.objects.create(
            job=job,
            gpu=gpu,
            node=gpu.node,
            attempt=1,
            share_milli=1000,
            gpu_model=model,
            started_at=now,
        )
    Job.objects.bulk_update(running, ["state", "finished_at"])
    timed = created[len(created) // 2]
    JobEvent.objects.bulk_create(
        JobEvent(
            job=timed,
            from_state="queued",
            to_state="scheduled",
            actor_label="system",
            reason=f"event {k}",
        )
        for k in range(10)
    )
    return {
        "project": project.pk,
        "job": timed.pk,
        "running": running[0].pk if running else timed.pk,
    }


def time_page(client: object, url: str, n: int) -> list[float]:
    for _ in range(5):
        client.get(url)  # type: ignore[attr-defined]
    out = []
    for _ in range(n):
        t = time.perf_counter()
        response = client.get(url)  # type: ignore[attr-defined]
        out.append((time.perf_counter() - t) * 1000)
        assert response.status_code == 200, (url, response.status_code)
    return out


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20)[18]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=10_000)
    parser.add_argument("--baseline", type=int, default=100)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    setup("pages")
    from django.conf import settings
    from django.test import Client

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]

    from portal.models import User
    from scheduler.models import Gpu, GpuModel, Pool
    from scheduler.seed import catalog_seed, node_register_simulated

    catalog_seed()
    from billing import services as billing_services

    billing_services.price_list_seed()
    pool, _ = Pool.objects.get_or_create(name="default")
    model = GpuModel.objects.get(name="H100-80GB-SXM")
    for n in range(8):
        node_register_simulated(
            name=f"n{n}",
            pool=pool,
            gpu_model=model,
            gpu_count=8,
            cpu_milli=128_000,
            memory_mib=1_000_000,
            state="ready",
        )
    assert Gpu.objects.count() == 64
    from django.db import connection

    results = []
    for label, jobs in (("baseline", args.baseline), ("history", args.history)):
        owner = User.objects.create_user(f"{label}@bench.example", "pw-bench-1")
        ids = build(f"{label}-proj", jobs, owner)
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE")  # as autovacuum would after a bulk load
        client = Client()
        client.force_login(owner)
        client.cookies["current_project"] = f"{label}-proj"
        pages = {
            "dashboard": "/",
            "job page (finished)": f"/jobs/{ids['job']}/",
            "job page (running)": f"/jobs/{ids['running']}/",
            "submit form": "/jobs/new/",
        }
        for page, url in pages.items():
            samples = time_page(client, url, args.requests)
            results.append((label, jobs, page, statistics.median(samples), p95(samples)))
    teardown()
    by_page: dict[str, dict[str, tuple[float, float]]] = {}
    for label, _jobs, page, median, q95 in results:
        by_page.setdefault(page, {})[label] = (median, q95)
    rows = []
    for page, r in by_page.items():
        (b50, b95), (h50, h95) = r["baseline"], r["history"]
        rows.append(
            [
                page,
                f"{b50:.1f}",
                f"{b95:.1f}",
                f"{h50:.1f}",
                f"{h95:.1f}",
                f"{h95 / b95:.2f}",
                "met" if h95 < TARGET_P95_MS else "missed",
            ]
        )
    table = markdown_table(
        [
            "page",
            f"p50 ms, {args.baseline:,} jobs",
            f"p95 ms, {args.baseline:,} jobs",
            f"p50 ms, {args.history:,} jobs",
            f"p95 ms, {args.history:,} jobs",
            "p95 ratio",
            f"p95 < {TARGET_P95_MS:.0f} ms",
        ],
        rows,
    )
    print(table)
    if not args.no_docs:
        write_section(
            "pages",
            "## Pages with a long history (issue 19)\n\n"
            f"`{command_line('bench.pages')}`\n\n"
            f"{args.requests} requests per page through Django's test client (middleware, "
            "session, templates) after 5 warm-up requests, on PostgreSQL; the baseline project "
            f"({args.baseline:,} jobs) and the long history ({args.history:,} jobs) side by side "
            "in one run.\n\n" + table,
        )


if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    main()
