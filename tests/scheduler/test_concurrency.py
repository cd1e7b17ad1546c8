"""No GPU is ever double-allocated: cycles and submissions raced against PostgreSQL."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest
from django.db import connection

from foundation.locks import single_flight
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


def test_racing_submits_of_one_project_hold_its_max_gpus_quota(team, fleet):
    """Many concurrent submits of one project, cycles and quota edits racing them: every
    submission gets its verdict, its two events and its audit event, none is lost, and the
    project never holds more GPUs than its quota (the fleet has room for more)."""
    from portal.models import AuditEvent
    from scheduler.models import Job, JobEvent, JobState, Quota

    assert connection.vendor == "postgresql"
    project, member = team["a"], team["member"]
    Quota.objects.filter(project=project).update(max_gpus=3, allow_borrowing=False)
    errors: list[BaseException] = []
    submitted: list[int] = []
    barrier = threading.Barrier(10)

    def submitter(n: int) -> None:
        try:
            barrier.wait()
            for i in range(8):
                too_big = i % 4 == 0  # 4 GPUs at once: over the project's 3
                jobs = job_submit(
                    actor=member,
                    project=project,
                    spec=JobSpec(name=f"q{n}-{i}", command="true", gpus=4 if too_big else 1),
                )
                submitted.extend(j.pk for j in jobs)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def cycler() -> None:
        try:
            barrier.wait()
            for _ in range(6):
                with single_flight("scheduler-cycle", ttl=65) as acquired:  # as the task does
                    if acquired:
                        run_cycle()
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    def quota_editor() -> None:  # an owner editing the quota while admissions run
        try:
            barrier.wait()
            for _ in range(20):
                Quota.objects.filter(project=project).update(max_gpus=3)
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=submitter, args=(n,)) for n in range(7)]
    threads += [threading.Thread(target=cycler) for _ in range(2)]
    threads.append(threading.Thread(target=quota_editor))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    run_cycle()

    jobs = list(Job.objects.filter(project=project))
    assert len(submitted) == len(set(submitted)) == len(jobs) == 7 * 8  # no admission lost
    big = [j for j in jobs if j.gpus == 4]
    small = [j for j in jobs if j.gpus == 1]
    assert len(big) == 14 and all(j.state == JobState.REJECTED for j in big)
    assert all(j.state != JobState.REJECTED and not j.borrowed for j in small)
    for job in jobs:
        states = list(job.events.order_by("pk").values_list("from_state", "to_state"))
        expected = JobState.REJECTED if job.gpus == 4 else JobState.QUEUED
        assert states[:2] == [("", JobState.PENDING), (JobState.PENDING, expected)], states
    audited = AuditEvent.objects.filter(project=project, action__in=["job.submit", "job.reject"])
    assert sorted(int(e.target_id) for e in audited) == sorted(submitted)
    admission_events = JobEvent.objects.filter(job__project=project, from_state__in=["", "pending"])
    assert admission_events.count() == 2 * len(jobs)

    # the quota held at every instant, not only at the end; a GPU counts as the job's share of
    # it (an allocation's share_milli is in the GPU's capacity units, 2000 on a time-sliced ×2)
    mine = list(Allocation.objects.filter(job__project=project).select_related("job"))
    changes = sorted(
        [(a.started_at, a.job.gpu_milli) for a in mine]
        + [(a.ended_at, -a.job.gpu_milli) for a in mine if a.ended_at is not None],
        key=lambda e: (e[0], e[1]),
    )
    level = peak = 0
    for _, delta in changes:
        level += delta
        peak = max(peak, level)
    assert peak <= 3000, peak
    held = sum(a.job.gpu_milli for a in mine if a.ended_at is None)
    assert held == 3000  # the quota, not the fleet (4 × H100 + 8 L4 slots), is what stopped it
