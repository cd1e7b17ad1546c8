"""The submit path's shortcuts give the same answers as the long way round.

Serializer fields are copied from a per-class prototype instead of being rebuilt, the user's
role comes with the project it was looked up for, and billing reads a project's standing in
one statement. Each shortcut is checked against what it replaced.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from rest_framework import serializers

from billing.admission import budget_check
from billing.models import BillingAccount, Budget, ProjectBilling
from portal.errors import NotFound
from portal.models import Role
from portal.selectors import project_get_visible, project_role_of
from portal.services import require_role
from scheduler.admission import JobSpec, job_submit
from scheduler.api.jobs import (
    JobCreateSerializer,
    JobDetailSerializer,
    JobSerializer,
    ManifestJobSerializer,
)

pytestmark = pytest.mark.django_db


class RebuiltJobSerializer(JobSerializer):
    """JobSerializer with DRF's own field construction: every field built anew."""

    def get_fields(self) -> dict[str, serializers.Field]:  # type: ignore[type-arg]
        return serializers.ModelSerializer.get_fields(self)


def test_each_serializer_instance_binds_its_own_copy_of_the_fields():
    first, second = JobCreateSerializer(data={}), JobCreateSerializer(data={})
    assert set(first.fields) == set(second.fields) == set(JobCreateSerializer._declared_fields)
    for name in first.fields:
        assert first.fields[name] is not second.fields[name]
        assert first.fields[name].parent is first
        assert second.fields[name].parent is second
        assert first.fields[name].field_name == name


def test_a_subclass_does_not_inherit_its_parents_prototype(team, fleet):
    job = job_submit(
        actor=team["owner"],
        project=team["a"],
        spec=JobSpec(name="x", command="true", gpu_model=fleet["h100"]),
    )[0]
    assert set(JobSerializer(job).data) == set(JobSerializer.Meta.fields)  # prototype built
    detail = JobDetailSerializer(job).data
    assert set(detail) == set(JobDetailSerializer.Meta.fields)
    assert {"env", "working_dir", "placement"} <= set(detail)
    assert set(JobSerializer(job).data) == set(JobSerializer.Meta.fields)


def test_prototype_fields_represent_jobs_as_drf_builds_them(team, fleet):
    owner, project = team["owner"], team["a"]
    jobs = job_submit(
        actor=owner,
        project=project,
        spec=JobSpec(name="arr", command="true", gpu_model=fleet["h100"], shard_count=3),
    )
    jobs += job_submit(
        actor=owner,
        project=project,
        spec=JobSpec(name="frac", command="true", gpu_milli=250, gpu_memory_mib=4096),
    )
    for job in jobs:
        assert JobSerializer(job).data == RebuiltJobSerializer(job).data
    assert JobSerializer(jobs, many=True).data == RebuiltJobSerializer(jobs, many=True).data


class RebuiltDetailSerializer(JobDetailSerializer):
    def get_fields(self) -> dict[str, serializers.Field]:  # type: ignore[type-arg]
        return serializers.ModelSerializer.get_fields(self)


class RebuiltManifestSerializer(ManifestJobSerializer):
    def get_fields(self) -> dict[str, serializers.Field]:  # type: ignore[type-arg]
        return serializers.ModelSerializer.get_fields(self)


def test_read_plan_answers_what_drf_answers_for_every_kind_of_job(team, fleet):
    """Queued, rejected, array shards (a parent id), fractions, and the detail and manifest
    serializers (fields the plan leaves to DRF: nested, dict, method fields of a subclass)."""
    from scheduler.models import Job, Quota

    owner, project = team["owner"], team["a"]
    jobs = job_submit(
        actor=owner,
        project=project,
        spec=JobSpec(
            name="arr",
            command="true",
            gpu_model=fleet["h100"],
            shard_count=2,
            env={"A": "1"},
            secret_env={"S": "x"},
            time_limit_s=3600,
            precisions=("fp16",),
        ),
    )
    Quota.objects.filter(project=project).update(max_gpus_per_job=1)
    jobs += job_submit(actor=owner, project=project, spec=JobSpec(name="big", command="x", gpus=2))
    assert jobs[-1].state == "rejected" and jobs[-1].finished_at is not None
    jobs += [Job.objects.select_related("project", "gpu_model").get(pk=j.pk) for j in jobs]
    for job in jobs:
        assert JobSerializer(job).data == RebuiltJobSerializer(job).data
        assert JobDetailSerializer(job).data == RebuiltDetailSerializer(job).data
        assert ManifestJobSerializer(job).data == RebuiltManifestSerializer(job).data
    assert jobs[1].array_parent_id and JobSerializer(jobs[1]).data["array_parent"] == jobs[0].pk
    read = JobSerializer(jobs[0])
    assert read.data and "fields" not in read.__dict__  # read by the plan: no field was copied


def test_read_plan_leaves_unreadable_sources_to_drf(team, fleet):
    """A source DRF reads its own way (a dotted one through a missing submitter) answers
    what DRF answers; a serializer whose fields were taken and changed is read from them."""
    job = job_submit(
        actor=team["owner"], project=team["a"], spec=JobSpec(name="x", command="true")
    )[0]
    job.submitted_by = None
    data = JobSerializer(job).data
    assert data["submitted_by"] is None and data == RebuiltJobSerializer(job).data
    narrowed = JobSerializer(job)
    narrowed.fields.pop("command")
    assert "command" not in narrowed.data and narrowed.data["name"] == "x"


def test_prototype_fields_validate_concurrent_requests_independently(fleet):
    """Threads validating at once each get their own verdict: no state shared between them."""
    good = {"project": "alpha", "name": "ok", "command": "true", "gpus": 2}

    def validate(i: int) -> tuple[int, bool, dict[str, object]]:
        body = dict(good, name=f"ok{i}") if i % 2 else dict(good, gpus=0, name=f"bad{i}")
        s = JobCreateSerializer(data=body)
        return i, s.is_valid(), dict(s.errors) if s.errors else dict(s.validated_data)

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(validate, range(200)))
    for i, valid, detail in results:
        if i % 2:
            assert valid and detail["name"] == f"ok{i}" and detail["gpus"] == 2
        else:
            assert not valid and set(detail) == {"gpus"}


def test_visible_project_carries_the_role_so_the_check_costs_no_query(
    team, django_assert_num_queries
):
    with django_assert_num_queries(1):
        project = project_get_visible(user=team["viewer"], slug="alpha")
        assert project_role_of(user=team["viewer"], project=project) == Role.VIEWER
    with django_assert_num_queries(0), pytest.raises(Exception, match="viewer"):
        require_role(user=team["viewer"], project=project, roles=(Role.OWNER, Role.MEMBER))


def test_the_role_read_for_one_user_is_not_taken_for_another(team):
    project = project_get_visible(user=team["viewer"], slug="alpha")
    assert project_role_of(user=team["owner"], project=project) == Role.OWNER
    assert project_role_of(user=team["outsider"], project=project) is None


def test_staff_see_any_project_as_viewers_and_strangers_see_none(team, make_user):
    staff = make_user(staff=True)
    project = project_get_visible(user=staff, slug="beta")
    assert project_role_of(user=staff, project=project) == Role.VIEWER
    with pytest.raises(NotFound):
        project_get_visible(user=team["member"], slug="beta")
    with pytest.raises(NotFound):
        project_get_visible(user=team["member"], slug="no-such-project")


def test_budget_standing_is_one_statement_and_says_what_the_rules_say(
    team, fleet, django_assert_num_queries
):
    project, now = team["a"], timezone.now()
    spec = JobSpec(name="x", command="true", gpu_model=fleet["h100"])
    with django_assert_num_queries(1):
        assert budget_check(project=project, spec=spec, now=now) is None  # no account, no budget
    account = BillingAccount.objects.create(name="Acme")
    ProjectBilling.objects.create(project=project, account=account)
    Budget.objects.create(project=project, monthly_amount=Decimal("100.00"), hard_cap=True)
    verdict = budget_check(project=project, spec=spec, now=now)
    assert verdict is not None and verdict.admit
    # a hard cap counts the job's expected cost: its time limit, or the stated assumption
    assert verdict.quota_notes[0] == "budget: $0.00 of $100.00 this month"
    assert "expected" in verdict.quota_notes[1] and "1 h assumed" in verdict.quota_notes[1]
    account.payment_failed_at = now - timedelta(days=60)
    account.save()
    verdict = budget_check(project=project, spec=spec, now=now)
    assert verdict is not None and not verdict.admit
    assert verdict.reason.startswith("Payment overdue")
    account.payment_failed_at = now - timedelta(hours=1)  # still within the grace period
    account.save()
    verdict = budget_check(project=project, spec=spec, now=now)
    assert verdict is not None and verdict.admit


def test_the_compiled_catalog_lookup_reads_what_the_orm_reads(fleet):
    from django.forms.models import model_to_dict

    from scheduler.models import GpuModel
    from scheduler.selectors import gpu_model_active

    h100 = GpuModel.objects.get(name="H100-80GB-SXM")
    found = gpu_model_active("H100-80GB-SXM")
    assert found is not None and found.pk == h100.pk and not found._state.adding
    assert model_to_dict(found) == model_to_dict(h100)
    assert gpu_model_active("no-such-gpu") is None
    GpuModel.objects.filter(pk=h100.pk).update(is_active=False)
    assert gpu_model_active("H100-80GB-SXM") is None  # retired from the catalog: at once


def test_a_retired_or_unknown_model_is_a_400_naming_the_field(team, fleet, api):
    from scheduler.models import GpuModel

    client = api(team["member"])
    body = {"project": "alpha", "name": "x", "command": "true", "gpu_model": "H100-80GB-SXM"}
    assert client.post("/api/v1/jobs", body, format="json").status_code == 201
    GpuModel.objects.filter(name="H100-80GB-SXM").update(is_active=False)
    for model in ["H100-80GB-SXM", "no-such-gpu", 42]:
        resp = client.post("/api/v1/jobs", dict(body, gpu_model=model), format="json")
        assert resp.status_code == 400, model
        error = resp.json()
        assert set(error["fields"]) == {"gpu_model"} and error["code"] == "invalid"
        if isinstance(model, str):
            assert error["fields"]["gpu_model"] == [
                f"Unknown GPU model '{model}'. GET /api/v1/gpu-models lists them."
            ]
            assert error["message"] == f"gpu_model: {error['fields']['gpu_model'][0]}"


def test_the_queued_cap_counts_the_projects_queue_under_the_quota_lock(team, fleet, settings):
    """The cap's count comes with the quota's locked read: queued jobs of this project count,
    other projects' and ended ones do not; past the cap nothing is written."""
    from portal.models import AuditEvent
    from scheduler.admission import QueueFull, quota_lock_for_admission
    from scheduler.models import Job, JobEvent

    owner, project = team["owner"], team["a"]
    settings.PROJECT_MAX_QUEUED_JOBS = 3
    spec = JobSpec(name="q", command="true", gpu_model=fleet["h100"])
    first = job_submit(actor=owner, project=project, spec=spec)[0]
    job_submit(actor=team["outsider"], project=team["b"], spec=spec)
    job_submit(actor=owner, project=project, spec=JobSpec(name="q", command="x", shard_count=2))
    assert quota_lock_for_admission(project).queued == 3
    with pytest.raises(QueueFull, match="has 3 jobs waiting; the cap is 3"):
        job_submit(actor=owner, project=project, spec=spec)
    assert Job.objects.filter(project=project).count() == 3
    assert JobEvent.objects.filter(job__project=project).count() == 6
    assert AuditEvent.objects.filter(project=project, action="job.submit").count() == 2
    Job.objects.filter(pk=first.pk).update(state="cancelled")
    assert quota_lock_for_admission(project).queued == 2
    assert job_submit(actor=owner, project=project, spec=spec)[0].state == "queued"
