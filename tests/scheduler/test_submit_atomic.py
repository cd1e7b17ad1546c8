"""A submission is all or nothing: the job, its events and its audit event commit together."""

from __future__ import annotations

from unittest import mock

import pytest

from portal.models import AuditEvent
from scheduler.admission import JobSpec, job_submit
from scheduler.models import Job, JobEvent
from scheduler.seed import catalog_seed

pytestmark = pytest.mark.django_db(transaction=True)  # no test transaction to hide a missing one


def test_a_submit_that_fails_midway_leaves_no_job_behind(team: dict[str, object]) -> None:
    catalog_seed()
    project, owner = team["a"], team["owner"]
    with (
        mock.patch("scheduler.admission.audit_event", side_effect=RuntimeError("audit down")),
        pytest.raises(RuntimeError, match="audit down"),
    ):
        job_submit(actor=owner, project=project, spec=JobSpec(name="half", command="true"))
    assert not Job.objects.filter(project=project).exists()
    assert not JobEvent.objects.exists()
    assert not AuditEvent.objects.filter(action="job.submit").exists()
