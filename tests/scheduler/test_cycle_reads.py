"""What a cycle reads, and what it may skip without changing a decision: decayed usage only
under fair share, the snapshot only when something is queued, the overdue-preemption
transaction only when a preemption is overdue."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.admission import JobSpec, job_submit
from scheduler.core.plan import PolicyConfig
from scheduler.cycle import orders_by_fair_share, run_cycle
from scheduler.models import Allocation, Gpu, GpuModel, Job, JobEvent, JobState, Pool


def heavy_past_usage(project, user) -> None:
    """Ten GPU-hours that ended an hour ago on every H100."""
    now = timezone.now()
    job = Job.objects.create(
        project=project, submitted_by=user, name="past", command="true", state=JobState.SUCCEEDED
    )
    Allocation.objects.bulk_create(
        Allocation(
            job=job,
            gpu=gpu,
            node_id=gpu.node_id,
            attempt=1,
            share_milli=1000,
            gpu_model_id=gpu.model_id,
            started_at=now - timedelta(hours=11),
            ended_at=now - timedelta(hours=1),
        )
        for gpu in Gpu.objects.filter(model__name="H100-80GB-SXM")
    )


@pytest.mark.django_db
@pytest.mark.parametrize(("policy", "placed_project"), [("fcfs", "a"), ("fairshare", "b")])
def test_fair_share_places_the_project_that_used_less(team, fleet, policy, placed_project):
    Pool.objects.update(queue_policy=policy)
    heavy_past_usage(team["a"], team["member"])
    h100 = GpuModel.objects.get(name="H100-80GB-SXM")
    spec = JobSpec(name="all-h100", command="true", gpus=4, gpu_model=h100)  # one at a time fits
    (first,) = job_submit(actor=team["member"], project=team["a"], spec=spec)
    (second,) = job_submit(actor=team["outsider"], project=team["b"], spec=spec)
    result = run_cycle()
    assert result.placed == [{"a": first.pk, "b": second.pk}[placed_project]]


def test_only_the_fair_share_policy_reads_usage():
    assert not orders_by_fair_share(PolicyConfig(queue="priority"))
    assert orders_by_fair_share(PolicyConfig(queue="fairshare"))
    assert orders_by_fair_share(
        PolicyConfig(queue="fcfs", pools={"batch": PolicyConfig(queue="fairshare")})
    )


@pytest.mark.django_db
def test_with_nothing_queued_the_cycle_reads_no_snapshot(team, fleet, django_assert_num_queries):
    spec = JobSpec(name="one", command="true")
    (job,) = job_submit(actor=team["member"], project=team["a"], spec=spec)
    assert run_cycle().placed == [job.pk]
    with django_assert_num_queries(2):  # overdue preemptions? anything queued? no and no
        assert run_cycle().placed == []
    (later,) = job_submit(actor=team["member"], project=team["a"], spec=spec)
    assert run_cycle().placed == [later.pk]


@pytest.mark.django_db
def test_a_preemption_unconfirmed_past_grace_is_requeued_once_a_minute_over(team, fleet):
    spec = JobSpec(name="victim", command="true", preemptible=True)
    (job,) = job_submit(actor=team["member"], project=team["a"], spec=spec)
    assert run_cycle().placed == [job.pk]
    deadline = timezone.now()
    Job.objects.filter(pk=job.pk).update(state=JobState.PREEMPTING, preempt_deadline=deadline)
    run_cycle(now=deadline + timedelta(seconds=59))
    assert Job.objects.get(pk=job.pk).state == JobState.PREEMPTING
    run_cycle(now=deadline + timedelta(seconds=61))
    assert JobEvent.objects.filter(
        job=job, from_state=JobState.PREEMPTING, to_state=JobState.QUEUED
    ).exists()
    assert not Allocation.objects.filter(job=job, ended_at__isnull=True, attempt=1).exists()


@pytest.mark.django_db
def test_a_snapshot_takes_again_only_what_has_not_changed_since_the_last(team, fleet):
    """Running work and GPU views are taken from the previous snapshot while their rows are
    unchanged, and built anew from the rows as soon as anything of them changes."""
    from scheduler.cycle import build_state

    spec = JobSpec(name="one", command="true", gpus=1)
    (job,) = job_submit(actor=team["member"], project=team["a"], spec=spec)
    assert run_cycle().placed == [job.pk]
    now = timezone.now()
    first = build_state(now=now, with_usage=False).snapshot
    again = build_state(now=now, with_usage=False).snapshot
    assert again == first
    assert again.running[0] is first.running[0]  # taken again, not rebuilt
    gpu_id = again.running[0].shares[0].gpu_id
    Job.objects.filter(pk=job.pk).update(state=JobState.RUNNING, priority=7)
    Gpu.objects.filter(pk=gpu_id).update(health=Gpu.Health.UNHEALTHY)
    changed = build_state(now=now, with_usage=False).snapshot
    assert changed.running[0].priority == 7
    (view,) = [g for n in changed.nodes for g in n.gpus if g.gpu_id == gpu_id]
    assert not view.healthy
    Allocation.objects.filter(job=job).update(ended_at=now)
    assert build_state(now=now, with_usage=False).snapshot.running == ()
    views = {
        g.gpu_id: g for n in build_state(now=now, with_usage=False).snapshot.nodes for g in n.gpus
    }
    assert views[gpu_id].used_milli == 0
