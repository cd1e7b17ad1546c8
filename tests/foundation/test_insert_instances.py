"""`insert_instances` writes the rows `save()` would write, from SQL built once per model."""

from __future__ import annotations

import pytest
from django.forms.models import model_to_dict

from foundation.db import insert_instances
from portal.audit import audit_record
from portal.models import AuditEvent
from scheduler.models import Job, JobEvent, JobState

pytestmark = pytest.mark.django_db

VOLATILE = {"id", "created_at", "updated_at"}  # set by the database or the clock


def row(obj) -> dict:
    fresh = type(obj).objects.get(pk=obj.pk)
    return {k: v for k, v in model_to_dict(fresh).items() if k not in VOLATILE}


def a_job(team, fleet, **overrides) -> Job:
    fields = {
        "project": team["a"],
        "submitted_by": team["member"],
        "name": "twin",
        "command": "python train.py",
        "env": {"SEED": "1"},
        "gpu_model": fleet["h100"],
        "precisions": ["bf16", "fp8"],
        "state": JobState.QUEUED,
        "runtime_estimate_s": 600,
        **overrides,
    }
    return Job(**fields)


def test_a_job_inserted_is_the_job_saved(team, fleet):
    saved, inserted = a_job(team, fleet), a_job(team, fleet)
    saved.save()
    insert_instances([inserted])
    assert inserted.pk is not None and inserted.pk != saved.pk
    assert not inserted._state.adding
    assert row(inserted) == row(saved)
    fresh = Job.objects.get(pk=inserted.pk)
    assert fresh.created_at is not None and fresh.created_at == inserted.created_at


def test_many_rows_in_one_statement_get_their_own_keys_in_order(
    team, fleet, django_assert_num_queries
):
    job = a_job(team, fleet)
    job.save()
    events = [
        JobEvent(job=job, to_state=JobState.PENDING, actor_label="x", reason=f"r{i}")
        for i in range(3)
    ]
    with django_assert_num_queries(1):
        insert_instances(events)
    assert [JobEvent.objects.get(pk=e.pk).reason for e in events] == ["r0", "r1", "r2"]


def test_plain_values_nulls_and_prepared_values_mix_in_one_statement(team, fleet):
    """Rows whose NULLs differ (written into the statement), JSON, choices and plain values
    of each kind, as `save()` writes them."""
    kinds = [
        {"time_limit_s": None, "env": {}, "preemptible": True, "priority": 3},
        {"time_limit_s": 3600, "nodes": 2, "gpus_per_node": 4, "resize": {"to": 2}},
        {"runtime_estimate_s": None, "gpu_model": None, "state": "queued", "restarts": 0},
    ]
    saved = [a_job(team, fleet, **k) for k in kinds]
    for job in saved:
        job.save()
    inserted = [a_job(team, fleet, **k) for k in kinds]
    insert_instances(inserted)
    assert [row(j) for j in inserted] == [row(j) for j in saved]


def test_an_audit_event_is_written_whole(team):
    event = audit_record(
        actor=team["owner"], action="test.thing", target=team["a"], project=team["a"], data={"k": 1}
    )
    fresh = AuditEvent.objects.get(pk=event.pk)
    assert (fresh.actor, fresh.action, fresh.target_type, fresh.target_id, fresh.data) == (
        team["owner"],
        "test.thing",
        "portal.project",
        str(team["a"].pk),
        {"k": 1},
    )
    assert fresh.created_at is not None


def test_a_large_batch_goes_to_bulk_create_and_still_gets_its_keys(team, fleet):
    from foundation.db import _INSERT_SQL, INSERT_SQL_MAX_ROWS

    job = a_job(team, fleet)
    job.save()
    n = INSERT_SQL_MAX_ROWS + 5
    events = [
        JobEvent(job=job, to_state=JobState.PENDING, actor_label="x", reason=f"r{i}")
        for i in range(n)
    ]
    insert_instances(events)
    width = len(JobEvent._meta.concrete_fields) - 1  # all but the key
    kept = [nulls for model, nulls in _INSERT_SQL if model is JobEvent]
    assert kept and all(len(nulls) < n * width for nulls in kept)  # none for a one-off size
    assert [JobEvent.objects.get(pk=e.pk).reason for e in events] == [f"r{i}" for i in range(n)]


def test_groups_of_several_models_go_in_one_statement_each_row_with_its_key(
    team, fleet, django_assert_num_queries
):
    """A job's events and its audit event in one statement: every row as `save()` writes it,
    and each instance gets its own key, in order."""
    from portal.audit import audit_event

    job = a_job(team, fleet)
    job.save()
    events = [
        JobEvent(job=job, to_state=JobState.PENDING, actor_label="x", reason=f"r{i}")
        for i in range(3)
    ]
    audit = audit_event(
        actor=team["member"], action="job.submit", target=job, data={"jobs": [job.pk]}
    )
    with django_assert_num_queries(1):
        insert_instances(events, [audit], [])
    assert [JobEvent.objects.get(pk=e.pk).reason for e in events] == ["r0", "r1", "r2"]
    assert all(not e._state.adding for e in [*events, audit])
    saved = audit_event(
        actor=team["member"], action="job.submit", target=job, data={"jobs": [job.pk]}
    )
    saved.save()
    assert row(audit) == row(saved)
    insert_instances()  # nothing to write: no statement
