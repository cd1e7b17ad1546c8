"""Quotas moved from portal to the scheduler without moving a row.

A database at the schema before the move (portal 0002, scheduler 0005) is filled through the
historical models, migrated forward by Django's MigrationExecutor on PostgreSQL, and read back
through today's models: every quota, per-model limit and job is there, unchanged, and relations
between them still resolve.
"""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.db.migrations.recorder import MigrationRecorder

from portal.models import Project
from scheduler.models import Job, PriorityClass, Quota, QuotaModelLimit

BEFORE = [("portal", "0002_audit_append_only"), ("scheduler", "0005_job_time_limit_image_digest")]
MOVE = [("portal", "0003_quotas_to_scheduler"), ("scheduler", "0006_quotas_from_portal")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


def _leaves():
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


@pytest.mark.django_db(transaction=True)
def test_moving_quotas_to_the_scheduler_keeps_every_row():
    assert connection.vendor == "postgresql"
    executor = _migrate(BEFORE)
    try:
        assert not any(m in MigrationRecorder(connection).applied_migrations() for m in MOVE)
        old = executor.loader.project_state(BEFORE).apps
        User = old.get_model("portal", "User")
        OldProject = old.get_model("portal", "Project")
        OldQuota = old.get_model("portal", "Quota")
        OldLimit = old.get_model("portal", "QuotaModelLimit")
        GpuModel = old.get_model("scheduler", "GpuModel")
        OldJob = old.get_model("scheduler", "Job")
        OldContentType = old.get_model("contenttypes", "ContentType")
        OldContentType.objects.get_or_create(app_label="portal", model="quota")

        user = User.objects.create(email="mover@example.org", password="!")
        h100, l4 = (
            GpuModel.objects.create(
                name=name,
                display_name=name,
                architecture="Hopper",
                compute_capability="9.0",
                memory_gb=memory,
                tflops_fp16_bf16=Decimal("100.0"),
                tflops_fp32=Decimal("50.0"),
                price_per_gpu_hour=Decimal("2.50"),
            )
            for name, memory in (("H100-MOVE", 80), ("L4-MOVE", 24))
        )
        expected_quotas, expected_limits, expected_jobs = {}, {}, {}
        for i, (max_gpus, hours, per_job, prio, borrow) in enumerate(
            [(None, None, 8, 1, True), (16, 2000, 4, 3, False), (0, 10, 1, 0, True)]
        ):
            project = OldProject.objects.create(slug=f"move-{i}", name=f"Move {i}")
            quota = OldQuota.objects.create(
                project=project,
                max_gpus=max_gpus,
                gpu_hours_per_month=hours,
                max_gpus_per_job=per_job,
                max_priority=prio,
                allow_borrowing=borrow,
            )
            expected_quotas[quota.pk] = (project.pk, max_gpus, hours, per_job, prio, borrow)
            for model, n in ((h100, i + 1), (l4, 2 * i)):
                limit = OldLimit.objects.create(quota=quota, gpu_model=model, max_gpus=n)
                expected_limits[limit.pk] = (quota.pk, model.pk, n)
            job = OldJob.objects.create(
                project=project,
                submitted_by=user,
                name=f"train-{i}",
                command="python train.py",
                gpus=per_job,
                priority=prio,
                gpu_model=h100,
            )
            expected_jobs[job.pk] = (project.pk, prio, per_job)

        _migrate(_leaves())
        applied = MigrationRecorder(connection).applied_migrations()
        assert all(m in applied for m in MOVE)

        assert {
            q.pk: (
                q.project_id,
                q.max_gpus,
                q.gpu_hours_per_month,
                q.max_gpus_per_job,
                q.max_priority,
                q.allow_borrowing,
            )
            for q in Quota.objects.all()
        } == expected_quotas
        assert {
            lim.pk: (lim.quota_id, lim.gpu_model_id, lim.max_gpus)
            for lim in QuotaModelLimit.objects.all()
        } == expected_limits
        assert {
            j.pk: (j.project_id, j.priority, j.gpus) for j in Job.objects.all()
        } == expected_jobs
        # relations resolve from both sides, through today's models
        urgent = Project.objects.select_related("quota").get(slug="move-1")
        assert urgent.quota.max_priority == PriorityClass.URGENT
        assert sorted(urgent.quota.model_limits.values_list("max_gpus", flat=True)) == [2, 2]
        assert Job.objects.get(project=urgent).priority == PriorityClass.URGENT
        # the admin's permissions follow the model: its content type was relabelled
        assert ContentType.objects.filter(app_label="scheduler", model="quota").exists()
        assert not ContentType.objects.filter(app_label="portal", model="quota").exists()
    finally:
        _migrate(_leaves())
