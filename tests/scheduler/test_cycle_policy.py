"""The cycle reads what its pool's policy needs: fair share orders by decayed usage, which
the cycle reads only under that policy."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.admission import JobSpec, job_submit
from scheduler.core.plan import PolicyConfig
from scheduler.cycle import orders_by_fair_share, run_cycle
from scheduler.models import Allocation, Gpu, GpuModel, Job, JobState, Pool


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
