"""A share of a time-sliced GPU counts the same everywhere: the part of the device it holds
(`scheduler.core.model.device_share_milli`) is what billing meters, what the project's
monthly GPU-hours quota counts, and what monitoring's efficiency and cost count."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.db.models import Sum

from billing import pricing, services
from billing.models import UsageRecord
from monitoring.fleet import queue_by_model
from monitoring.selectors import efficiency_for_jobs
from scheduler.models import Gpu, Job, JobState
from scheduler.selectors import project_gpu_hours
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db


def test_quota_billing_and_monitoring_count_a_time_sliced_share_alike(lab, place):
    l4 = Gpu.objects.filter(model=lab["l4"]).order_by("pk").first()
    assert l4.capacity_milli == 2000  # time-sliced ×2
    start, end = at("2025-03-10 08:00"), at("2025-03-10 10:00")
    alloc = place(gpu=l4, share=500, start=start, end=end)
    services.usage_meter(now=end + timedelta(hours=1))
    metered = UsageRecord.objects.filter(job=alloc.job).aggregate(m=Sum("milli_seconds"))["m"]
    billed_hours = pricing.gpu_hours(metered)
    assert billed_hours == Decimal("0.5000")  # 2 h × 500m of a 2000m device = 2 h × 0.25
    quota_hours = project_gpu_hours(lab["a"], since=start, now=end + timedelta(hours=1))
    assert quota_hours == billed_hours.quantize(Decimal("0.01"))
    efficiency = efficiency_for_jobs([alloc.job_id], since=None, now=end)[alloc.job_id]
    assert Decimal(str(round(efficiency.gpu_hours, 4))) == billed_hours


def test_the_queue_counts_the_gpus_a_job_asks_for_as_admission_does(lab):
    from scheduler.admission import JobSpec

    shapes = [dict(gpus=3), dict(gpus=1, gpu_milli=250), dict(gpus=1, nodes=2, gpus_per_node=4)]
    for shape in shapes:
        Job.objects.create(
            project=lab["a"], submitted_by=lab["owner"], name="q", command="true",
            state=JobState.QUEUED, **shape,
        )  # fmt: skip
    expected = sum(JobSpec(name="q", command="true", **s).gpu_fraction for s in shapes)
    assert queue_by_model()["any"] == {"jobs": 3, "gpus": float(expected)}
