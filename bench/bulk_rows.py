"""Bulk writes on PostgreSQL: `foundation.db`'s plain-row statements against Django's own.

    .venv/bin/python -m bench.bulk_rows [--rows 2000] [--runs 5]

What the scheduling cycle writes when it places a big plan (`bench.cycle_scale`): job events
inserted (`foundation.db.insert_rows` against `bulk_create`, which on PostgreSQL also sends
one array per column through UNNEST) and queued jobs' pending reasons updated
(`foundation.db.bulk_update_rows`, one `UPDATE ... FROM unnest(...)`, against `bulk_update`, a
`CASE WHEN` per row and field). Each write runs in a transaction that is rolled back, the two
ways alternating; the table gives medians of the wall time and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench import command_line, markdown_table, spread, write_section
from bench.django_env import setup, teardown


def seed(n: int) -> list[int]:
    from portal.models import User
    from portal.services import project_create
    from scheduler.models import Job

    user = User.objects.create_user("bench@example.org", "x")
    project = project_create(owner=user, slug="bench", name="Bench")
    jobs = Job.objects.bulk_create(
        Job(project=project, submitted_by=user, name=f"j{i}", command="true", gpus=1)
        for i in range(n)
    )
    return [j.pk for j in jobs]


def rolled_back(write: Callable[[], Any]) -> float:
    from django.db import transaction

    with transaction.atomic():
        started = time.perf_counter()
        write()
        elapsed = time.perf_counter() - started
        transaction.set_rollback(True)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-docs", action="store_true", help="only print the table")
    args = parser.parse_args()
    setup("bulk")
    try:
        from django.utils import timezone

        from foundation.db import bulk_update_rows, insert_rows
        from scheduler.models import Job, JobEvent

        ids = seed(args.rows)
        now = timezone.now()
        event_fields = [
            "job",
            "created_at",
            "from_state",
            "to_state",
            "actor_label",
            "reason",
            "data",
        ]
        event_rows = [
            (pk, now, "queued", "scheduled", "scheduler", "Placed on n1", {"attempt": 1})
            for pk in ids
        ]
        pending_fields = ["pending_reason", "pending_message", "queue_position"]
        pending_rows = [(pk, "quota", f"waits {i}", i) for i, pk in enumerate(ids)]

        def plain_insert() -> None:
            insert_rows(JobEvent, event_fields, event_rows)

        def django_insert() -> None:
            JobEvent.objects.bulk_create(
                [
                    JobEvent(
                        job_id=pk,
                        created_at=at,
                        from_state=old,
                        to_state=new,
                        actor_label=label,
                        reason=reason,
                        data=data,
                    )
                    for pk, at, old, new, label, reason, data in event_rows
                ]
            )

        def plain_update() -> None:
            bulk_update_rows(Job, pending_fields, pending_rows)

        def django_update() -> None:
            objs = [
                Job(pk=pk, pending_reason=r, pending_message=m, queue_position=q)
                for pk, r, m, q in pending_rows
            ]
            Job.objects.bulk_update(objs, pending_fields, batch_size=500)

        cases = {
            "insert": (plain_insert, django_insert),
            "update": (plain_update, django_update),
        }
        times: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in cases}
        for plain, django in cases.values():  # warm up
            rolled_back(plain)
            rolled_back(django)
        for _ in range(args.runs):
            for name, (plain, django) in cases.items():
                times[name][0].append(rolled_back(plain))
                times[name][1].append(rolled_back(django))
    finally:
        teardown()
    rows = []
    for name, (plain_t, django_t) in times.items():
        p, d = statistics.median(plain_t), statistics.median(django_t)
        what = (
            "insert_rows vs bulk_create" if name == "insert" else "bulk_update_rows vs bulk_update"
        )
        ratios = [dt / pt for pt, dt in zip(plain_t, django_t, strict=True)]
        rows.append(
            [
                what,
                str(args.rows),
                spread([t * 1000 for t in plain_t]),
                spread([t * 1000 for t in django_t]),
                f"{d / p:.2f} (runs {min(ratios):.2f}–{max(ratios):.2f})",
            ]
        )
    table = markdown_table(
        [
            "write",
            "rows",
            "foundation.db ms, median (min–max)",
            "Django ms, median (min–max)",
            "Django / foundation.db",
        ],
        rows,
    )
    print(table)
    if not args.no_docs:
        write_section(
            "bulk_rows",
            "## Bulk writes: foundation.db's plain-row statements against Django's\n\n"
            f"`{command_line('bench.bulk_rows')}` — PostgreSQL, each write in a rolled-back "
            f"transaction, the two ways alternating; medians of {args.runs} runs.\n\n" + table,
        )


if __name__ == "__main__":
    main()
