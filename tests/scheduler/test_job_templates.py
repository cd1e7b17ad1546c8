"""Templates and resubmission: save a job as a template; clone or edit and resubmit any job,
on the pages and through the API."""

from __future__ import annotations

import re

import pytest

from portal.models import AuditEvent
from scheduler.models import Job, JobTemplate

pytestmark = pytest.mark.django_db

BODY = {
    "project": "alpha",
    "name": "train",
    "command": "python train.py --lr 3e-4",
    "image": "localhost/gpucloud-job:latest",
    "gpu_model": "H100-80GB-SXM",
    "gpus": 2,
    "priority": "high",
    "preemptible": True,
    "runtime_estimate_s": 7200,
    "time_limit_s": 10800,
    "env": {"SEED": "7", "MODE": "full"},
    "volumes": [{"name": "data", "path": "/data/in", "read_only": True}],
    "checkpoint": "ckpt:train",
    "working_dir": "/data/ckpt/train",
    "max_restarts": 2,
    "cpu_milli": 8000,
}


@pytest.fixture
def job(api, team, fleet, ckpt_volume):
    from storage.models import Volume

    Volume.objects.create(project=team["a"], name="data", kind="node_local", size_gib=1)
    resp = api(team["member"]).post("/api/v1/jobs", BODY, format="json")
    assert resp.status_code == 201, resp.json()
    return Job.objects.get(pk=resp.json()["id"])


def _request(job: Job) -> tuple:
    return (
        job.name,
        job.command,
        job.image,
        job.gpu_model.name,
        job.gpus,
        job.priority,
        job.preemptible,
        job.runtime_estimate_s,
        job.time_limit_s,
        job.env,
        job.volumes,
        job.checkpoint,
        job.working_dir,
        job.max_restarts,
        job.cpu_milli,
    )


def test_api_resubmit_clones_the_request_as_a_new_job(api, team, job):
    resp = api(team["member"]).post(f"/api/v1/jobs/{job.pk}/resubmit", {}, format="json")
    assert resp.status_code == 201, resp.json()
    clone = Job.objects.get(pk=resp.json()["id"])
    assert resp["Location"] == f"/api/v1/jobs/{clone.pk}"
    assert clone.pk != job.pk and _request(clone) == _request(job)
    assert clone.submitted_by == team["member"] and clone.project == job.project


def test_api_resubmit_with_changes_edits_only_those(api, team, job):
    resp = api(team["owner"]).post(
        f"/api/v1/jobs/{job.pk}/resubmit",
        {"gpus": 1, "env": {"SEED": "8"}, "name": "train-2"},
        format="json",
    )
    assert resp.status_code == 201, resp.json()
    clone = Job.objects.get(pk=resp.json()["id"])
    assert (clone.gpus, clone.env, clone.name) == (1, {"SEED": "8"}, "train-2")
    assert clone.command == job.command and clone.time_limit_s == 10800
    assert clone.submitted_by == team["owner"]


def test_api_resubmit_refuses_bad_changes_and_viewers(api, team, job):
    bad = api(team["member"]).post(f"/api/v1/jobs/{job.pk}/resubmit", {"gpus": 0}, format="json")
    assert bad.status_code == 400 and set(bad.json()["fields"]) == {"gpus"}
    unknown = api(team["member"]).post(
        f"/api/v1/jobs/{job.pk}/resubmit", {"bogus": 1}, format="json"
    )
    assert unknown.status_code == 400 and set(unknown.json()["fields"]) == {"bogus"}
    listed = api(team["member"]).post(f"/api/v1/jobs/{job.pk}/resubmit", [1], format="json")
    assert listed.status_code == 400
    viewer = api(team["viewer"]).post(f"/api/v1/jobs/{job.pk}/resubmit", {}, format="json")
    assert viewer.status_code == 403
    outsider = api(team["outsider"]).post(f"/api/v1/jobs/{job.pk}/resubmit", {}, format="json")
    assert outsider.status_code == 404
    assert Job.objects.count() == 1


def test_api_template_saved_listed_submitted_and_deleted(api, team, job):
    member = api(team["member"])
    resp = member.post(f"/api/v1/jobs/{job.pk}/template", {"name": "nightly"}, format="json")
    assert resp.status_code == 201, resp.json()
    template = JobTemplate.objects.get()
    assert resp["Location"] == f"/api/v1/job-templates/{template.pk}"
    assert template.body["command"] == BODY["command"] and template.project == job.project
    assert AuditEvent.objects.filter(action="scheduler.job_template.create").count() == 1

    again = member.post(f"/api/v1/jobs/{job.pk}/template", {"name": "nightly"}, format="json")
    assert again.status_code == 409

    listing = member.get("/api/v1/job-templates").json()
    assert [t["name"] for t in listing["results"]] == ["nightly"]
    assert api(team["outsider"]).get("/api/v1/job-templates").json()["results"] == []
    assert api(team["outsider"]).get(f"/api/v1/job-templates/{template.pk}").status_code == 404

    submitted = member.post(
        f"/api/v1/job-templates/{template.pk}/submit", {"shard_count": 2}, format="json"
    )
    assert submitted.status_code == 201, submitted.json()
    shards = Job.objects.exclude(pk=job.pk)
    assert shards.count() == 2 and all(s.command == BODY["command"] for s in shards)

    assert api(team["viewer"]).delete(f"/api/v1/job-templates/{template.pk}").status_code == 403
    assert member.delete(f"/api/v1/job-templates/{template.pk}").status_code == 204
    assert not JobTemplate.objects.exists()


def test_clone_page_fills_the_form_with_the_job(client, team, job):
    client.force_login(team["member"])
    html = client.get(f"/jobs/new/?from={job.pk}").content.decode()
    assert f"a copy of job #{job.pk}" in html
    assert "python train.py --lr 3e-4</textarea>" in html
    assert re.search(r'name="image"[^>]*value="localhost/gpucloud-job:latest"', html)
    assert re.search(r'value="H100-80GB-SXM"[^>]*checked', html)
    assert re.search(r'name="time_limit_h"[^>]*value="3', html)
    env = re.search(r'<textarea name="env"[^>]*>\n?(.*?)</textarea>', html, re.S)
    assert env and sorted(env.group(1).splitlines()) == ["MODE=full", "SEED=7"]
    assert re.search(r'name="preemptible"[^>]*checked', html)
    assert re.search(r'name="cpu_milli"[^>]*value="8000"', html)
    # another tenant's job cannot be cloned
    client.force_login(team["outsider"])
    assert client.get(f"/jobs/new/?from={job.pk}").status_code == 404


def test_save_template_on_the_job_page_then_start_from_it(client, team, job):
    client.force_login(team["member"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="clone"' in page and 'data-testid="save-template"' in page
    resp = client.post(f"/jobs/{job.pk}/template/", {"name": "my run"})
    assert resp.status_code == 302
    template = JobTemplate.objects.get(name="my run")
    form = client.get("/jobs/new/").content.decode()
    assert f"?template={template.pk}" in form and "my run" in form
    filled = client.get(f"/jobs/new/?template={template.pk}").content.decode()
    assert "the template &#x27;my run&#x27;" in filled
    assert "python train.py --lr 3e-4</textarea>" in filled
    # a blank name is refused with a message, nothing saved
    client.post(f"/jobs/{job.pk}/template/", {"name": ""})
    assert JobTemplate.objects.count() == 1
    client.post(f"/jobs/templates/{template.pk}/delete/")
    assert not JobTemplate.objects.exists()


def test_viewer_sees_no_resubmit_actions(client, team, job):
    client.force_login(team["viewer"])
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="clone"' not in page
    resp = client.post(f"/jobs/{job.pk}/template/", {"name": "x"})
    assert resp.status_code == 302 and not JobTemplate.objects.exists()
