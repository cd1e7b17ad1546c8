"""The invariants every fault test checks after (and during) the fault."""

from __future__ import annotations

from collections import Counter, defaultdict

from tests.scheduler.test_concurrency import max_concurrent_share


def assert_invariants() -> None:
    """No GPU over capacity at any instant, no job active twice, every job in a legal state,
    no usage slice counted twice, no invoice issued twice."""
    from billing.models import Invoice, UsageRecord
    from scheduler.models import ACTIVE_STATES, Allocation, Gpu, Job, JobState

    allocations = list(Allocation.objects.all())
    capacity = {g.pk: g.capacity_milli for g in Gpu.objects.all()}
    for gpu_id, peak in max_concurrent_share(allocations).items():
        assert peak <= capacity[gpu_id], (
            f"GPU {gpu_id} double-allocated: {peak} > {capacity[gpu_id]}"
        )
    active_attempts: dict[int, set[int]] = defaultdict(set)
    for a in allocations:
        if a.ended_at is None:
            active_attempts[a.job_id].add(a.attempt)
    states = dict(Job.objects.values_list("pk", "state"))
    for job_id, attempts in active_attempts.items():
        assert len(attempts) == 1, f"job {job_id} runs attempts {attempts} at once"
        assert states[job_id] in ACTIVE_STATES, f"job {job_id} holds GPUs in {states[job_id]}"
    assert set(states.values()) <= set(JobState.values)
    slices = Counter(UsageRecord.objects.values_list("allocation_id", "slice_start"))
    assert not [k for k, n in slices.items() if n > 1], "a usage slice was counted twice"
    periods = Counter(Invoice.objects.values_list("account_id", "period_start"))
    assert not [k for k, n in periods.items() if n > 1], "an invoice was issued twice"


def ledger() -> list[tuple[object, ...]]:
    from billing.models import UsageRecord

    return list(
        UsageRecord.objects.order_by("allocation_id", "slice_start").values_list(
            "allocation_id", "slice_start", "seconds", "amount"
        )
    )
