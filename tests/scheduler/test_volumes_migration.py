"""Jobs from before volumes (scheduler 0020): their host paths are kept to be read, never sent
again, and templates lose the keys a submission now refuses."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from scheduler.models import Job, JobTemplate

BEFORE = [("scheduler", "0019_gangs_and_resize")]


def _migrate(targets):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor


def _leaves():
    return MigrationExecutor(connection).loader.graph.leaf_nodes()


@pytest.mark.django_db(transaction=True)
def test_old_host_paths_are_kept_to_read_and_never_sent_again():
    executor = _migrate(BEFORE)
    try:
        old = executor.loader.project_state(BEFORE).apps
        User = old.get_model("portal", "User")
        Project = old.get_model("portal", "Project")
        OldJob = old.get_model("scheduler", "Job")
        OldTemplate = old.get_model("scheduler", "JobTemplate")
        user = User.objects.create(email="old@example.org", password="!")
        project = Project.objects.create(slug="old", name="Old")
        both = OldJob.objects.create(
            project=project, submitted_by=user, name="a", command="true",
            checkpoint_dir="/srv/ckpt", working_dir="/root",
        )  # fmt: skip
        plain = OldJob.objects.create(project=project, submitted_by=user, name="b", command="x")
        template = OldTemplate.objects.create(
            project=project, created_by=user, name="t",
            body={"name": "a", "command": "true", "checkpoint_dir": "/srv/ckpt",
                  "working_dir": "/root"},
        )  # fmt: skip

        _migrate(_leaves())

        job = Job.objects.get(pk=both.pk)
        assert job.legacy_host_paths == {"checkpoint_dir": "/srv/ckpt", "working_dir": "/root"}
        assert (job.working_dir, job.checkpoint, job.volumes) == ("", "", [])
        assert not job.has_checkpoint
        assert Job.objects.get(pk=plain.pk).legacy_host_paths == {}
        assert JobTemplate.objects.get(pk=template.pk).body == {"name": "a", "command": "true"}
    finally:
        _migrate(_leaves())
