"""No GPU is ever double-allocated: cycles and submissions raced against PostgreSQL."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
from django.db import connection

from scheduler.admission import JobSpec, job_submit
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Gpu

pytestmark = pytest.mark.django_db(transaction=True)


def max_concurrent_share(allocations: list[Allocation]) -> dict[int, int]:
    """For each GPU, the largest sum of shares active at any instant."""
    events: dict[int, list[tuple[object, int]]] = defaultdict(list)
    for a in allocations:
        events[a.gpu_id].append((a.started_at, a.share_milli))
        if a.ended_at is not None:
            events[a.gpu_id].append((a.ended_at, -a.share_milli))
    peak = {}
    for gpu_id, items in events.items():
        level = top = 0
        for _, delta in sorted(items, key=lambda e: (e[0], e[1])):  # ends before starts
            level += delta
            top = max(top, level)
        peak[gpu_id] = top
    return peak


def test_racing_cycles_and_submissions_never_over_allocate(team, fleet):
    assert connection.vendor == "postgresql"
    project, member = team["a"], team["member"]
    errors: list[BaseException] = []
    barrier = threading.Barrier(6)

    def submitter(n: int) -> None:
        try:
            barrier.wait()
            for i in range(8):
                milli = 1000 if (n + i) % 3 else 400
                job_submit(
                    actor=member,
                    project=project,
                    spec=JobSpec(
                        name=f"s{n}-{i}",
                        command="true",
                        gpu_milli=milli,
                        gpu_memory_mib=4000 if milli < 1000 else 0,
                    ),
                )
        except BaseException as exc:  # surfaced below
            errors.append(exc)
        finally:
            connection.close()

    def cycler() -> None:
        try:
            barrier.wait()
            for _ in range(10):
                run_cycle()  # deliberately without the single-flight lock
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(3)]
    threads += [threading.Thread(target=cycler) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    run_cycle()

    allocations = list(Allocation.objects.all())
    assert allocations, "the race placed nothing; the test would prove nothing"
    capacity = {g.pk: g.capacity_milli for g in Gpu.objects.all()}
    for gpu_id, peak in max_concurrent_share(allocations).items():
        assert peak <= capacity[gpu_id], (gpu_id, peak, capacity[gpu_id])
    # and each job holds its GPUs once
    per_job = defaultdict(list)
    for a in allocations:
        per_job[(a.job_id, a.attempt)].append(a.gpu_id)
    assert all(len(g) == len(set(g)) for g in per_job.values())
