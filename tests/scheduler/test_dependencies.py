"""Job dependencies (after_ok, after_any, as Slurm's --dependency) and arrays as one whole:
the array view, retrying only the failed shards."""

from __future__ import annotations

import pytest

from portal.models import AuditEvent
from scheduler.cycle import run_cycle
from scheduler.dependencies import dependencies_parse
from scheduler.models import Allocation, Job, JobDependency, JobState
from scheduler.transitions import job_transition

pytestmark = pytest.mark.django_db


def submit(api, user, *, project="alpha", **fields):
    body = {
        "project": project,
        "name": "j",
        "command": "true",
        "gpu_model": "H100-80GB-SXM",
        **fields,
    }
    return api(user).post("/api/v1/jobs", body, format="json")


def end(job_id: int, state: str) -> None:
    """Run a placed job to its end the way its agent's reports would."""
    job = Job.objects.get(pk=job_id)
    if job.state == JobState.SCHEDULED:
        job_transition(job=job, to=JobState.RUNNING, reason="started")
    job_transition(job=job, to=state, reason="exited")


def test_after_ok_waits_in_words_then_starts_when_the_job_succeeds(team, fleet, api):
    first = submit(api, team["member"]).json()["id"]
    resp = submit(api, team["member"], dependencies=[{"type": "after_ok", "job": first}])
    assert resp.status_code == 201, resp.content
    merge = resp.json()["id"]
    assert resp.json()["pending"]["message"] == f"waiting for job {first} to succeed"

    run_cycle()
    job = Job.objects.get(pk=merge)
    assert Job.objects.get(pk=first).state == JobState.SCHEDULED
    assert job.state == JobState.QUEUED and job.waiting_on_dependencies  # GPUs free: held anyway
    assert job.pending_reason == "dependency"
    assert not Allocation.objects.filter(job_id=merge).exists()

    end(first, JobState.SUCCEEDED)
    run_cycle()
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED
    assert job.events.filter(reason__startswith="Dependencies met").exists()


def test_after_ok_on_a_failed_job_fails_the_dependent_with_the_reason(team, fleet, api):
    first = submit(api, team["member"]).json()["id"]
    merge = submit(api, team["member"], dependencies=[{"type": "after_ok", "job": first}])
    merge_id = merge.json()["id"]
    run_cycle()
    end(first, JobState.FAILED)
    run_cycle()
    job = Job.objects.get(pk=merge_id)
    assert job.state == JobState.FAILED
    assert job.failure_reason == f"dependency can no longer be met: job {first} failed"
    assert AuditEvent.objects.filter(action="job.dependency_failed", target_id=str(merge_id))


def test_after_any_starts_after_a_failure_too(team, fleet, api):
    first = submit(api, team["member"]).json()["id"]
    after = submit(api, team["member"], dependencies=[{"type": "after_any", "job": first}])
    after_id = after.json()["id"]
    assert after.json()["pending"]["message"] == f"waiting for job {first} to end"
    run_cycle()
    end(first, JobState.FAILED)
    run_cycle()
    assert Job.objects.get(pk=after_id).state == JobState.SCHEDULED


def test_a_dependency_on_an_array_means_all_its_shards(team, fleet, api):
    shards = submit(api, team["member"], shard_count=3).json()
    root = shards[0]["id"]
    merge = submit(api, team["member"], dependencies=[{"type": "after_ok", "job": root}])
    merge_id = merge.json()["id"]
    assert merge.json()["pending"]["message"] == (
        f"waiting for array {root} to succeed (0 of 3 shards done)"
    )
    dep = JobDependency.objects.get(job_id=merge_id)
    assert dep.whole_array and dep.on_id == root

    run_cycle()  # three H100 shards on the two 2-GPU nodes
    end(root, JobState.SUCCEEDED)  # shard 0 alone is not the array
    end(shards[1]["id"], JobState.SUCCEEDED)
    run_cycle()
    job = Job.objects.get(pk=merge_id)
    assert job.state == JobState.QUEUED
    assert job.pending_message == f"waiting for array {root} to succeed (2 of 3 shards done)"

    end(shards[2]["id"], JobState.SUCCEEDED)
    run_cycle()
    assert Job.objects.get(pk=merge_id).state == JobState.SCHEDULED


def test_a_failed_shard_fails_the_merge_naming_the_shard(team, fleet, api):
    shards = submit(api, team["member"], shard_count=2).json()
    merge_id = submit(
        api, team["member"], dependencies=[{"type": "after_ok", "job": shards[0]["id"]}]
    ).json()["id"]
    run_cycle()
    end(shards[1]["id"], JobState.FAILED)
    run_cycle()
    job = Job.objects.get(pk=merge_id)
    assert job.state == JobState.FAILED
    assert f"shard 1 (job {shards[1]['id']}) failed" in job.failure_reason


def test_a_dependency_on_another_tenants_job_is_refused_as_unknown(team, fleet, api):
    theirs = submit(api, team["outsider"], project="beta").json()["id"]
    resp = submit(api, team["member"], dependencies=[{"type": "after_ok", "job": theirs}])
    assert resp.status_code == 400
    assert "dependencies" in resp.json()["fields"]
    assert "not in a project you can see" in resp.content.decode()
    assert not Job.objects.filter(project=team["a"]).exists()


@pytest.mark.parametrize(
    ("deps", "words"),
    [
        ([{"type": "after_maybe", "job": 1}], "after_maybe"),
        ([{"type": "after_ok", "job": 0}], "job"),
        ([{"type": "after_ok"}], "job"),
    ],
)
def test_bad_dependencies_are_a_400_naming_the_field(team, fleet, api, deps, words):
    resp = submit(api, team["member"], dependencies=deps)
    assert resp.status_code == 400, resp.content
    assert "dependencies" in resp.content.decode() and words in resp.content.decode()


def test_a_dependency_that_already_cannot_be_met_is_refused_at_submit(team, fleet, api):
    first = submit(api, team["member"]).json()["id"]
    api(team["member"]).post(f"/api/v1/jobs/{first}/cancel")
    resp = submit(api, team["member"], dependencies=[{"type": "after_ok", "job": first}])
    assert resp.status_code == 400
    assert f"job {first} cancelled" in resp.json()["message"]


def test_slurm_syntax_is_read_by_the_form_parser():
    assert dependencies_parse("afterok:12:13, after_any:14") == (
        ("after_ok", 12),
        ("after_ok", 13),
        ("after_any", 14),
    )
    with pytest.raises(Exception, match="after_ok:12"):
        dependencies_parse("after_ok=12")


def test_the_array_view_and_retrying_only_the_failed_shards(team, fleet, api):
    shards = submit(api, team["member"], shard_count=3).json()
    root = shards[0]["id"]
    run_cycle()
    end(root, JobState.SUCCEEDED)
    end(shards[1]["id"], JobState.FAILED)
    client = api(team["member"])
    view = client.get(f"/api/v1/jobs/{shards[2]['id']}/array").json()  # any shard names it
    assert view["array"] == root and view["total"] == 3
    assert view["by_state"] == {"succeeded": 1, "failed": 1, "scheduled": 1}

    assert api(team["viewer"]).post(f"/api/v1/jobs/{root}/retry-failed").status_code == 403
    resp = client.post(f"/api/v1/jobs/{root}/retry-failed")
    assert resp.status_code == 200, resp.content
    assert [j["id"] for j in resp.json()] == [shards[1]["id"]]
    states = dict(Job.objects.filter(pk__in=[s["id"] for s in shards]).values_list("pk", "state"))
    assert states == {
        root: JobState.SUCCEEDED,
        shards[1]["id"]: JobState.QUEUED,
        shards[2]["id"]: JobState.SCHEDULED,
    }
    assert AuditEvent.objects.filter(action="job.array_retry", target_id=str(root)).exists()
    assert client.post(f"/api/v1/jobs/{root}/retry-failed").status_code == 409  # none left
    run_cycle()
    assert Job.objects.get(pk=shards[1]["id"]).state == JobState.SCHEDULED


def test_another_tenant_cannot_see_or_retry_an_array(team, fleet, api):
    shards = submit(api, team["member"], shard_count=2).json()
    outsider = api(team["outsider"])
    assert outsider.get(f"/api/v1/jobs/{shards[0]['id']}/array").status_code == 404
    assert outsider.post(f"/api/v1/jobs/{shards[0]['id']}/retry-failed").status_code == 404


def test_a_plain_job_has_no_array(team, fleet, api):
    job = submit(api, team["member"]).json()["id"]
    assert api(team["member"]).get(f"/api/v1/jobs/{job}/array").status_code == 404


# ---------------------------------------------------------------- pages

FORM = {
    "project": "alpha",
    "name": "merge",
    "command": "python merge.py",
    "gpu_model": "H100-80GB-SXM",
    "shape": "whole",
    "gpus": "1",
    "priority": "1",
    "shard_count": "1",
    "max_restarts": "0",
}


def test_the_form_takes_dependencies_in_slurms_syntax(client, team, fleet, api):
    root = submit(api, team["member"], shard_count=2).json()[0]["id"]
    client.force_login(team["member"])
    resp = client.post("/jobs/new/", {**FORM, "dependencies": f"afterok:{root}"})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    merge = Job.objects.get(name="merge")
    assert merge.waiting_on_dependencies
    page = client.get(f"/jobs/{merge.pk}/").content.decode()
    assert f"waiting for array {root} to succeed (0 of 2 shards done)" in page
    assert 'data-testid="dependencies"' in page


def test_the_form_puts_a_bad_dependency_next_to_its_field(client, team, fleet, api):
    theirs = submit(api, team["outsider"], project="beta").json()["id"]
    client.force_login(team["member"])
    for text, words in [("after_ok=3", "after_ok:12"), (f"after_ok:{theirs}", "can see")]:
        resp = client.post("/jobs/new/", {**FORM, "dependencies": text})
        assert resp.status_code == 400
        errors = resp.context["form"].errors
        assert "dependencies" in errors and words in str(errors["dependencies"])
    assert not Job.objects.filter(name="merge").exists()


def test_the_array_page_shows_shards_progress_and_retries_the_failed(team, fleet, api):
    from django.test import Client

    shards = submit(api, team["member"], shard_count=3).json()
    root = shards[0]["id"]
    run_cycle()
    end(root, JobState.SUCCEEDED)
    end(shards[2]["id"], JobState.FAILED)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(team["member"])
    page = browser.get(f"/jobs/{shards[1]['id']}/array/")
    html = page.content.decode()
    assert page.status_code == 200
    assert "2 of 3" in html and "1 failed" in html
    assert 'aria-valuenow="67"' in html
    assert 'data-testid="retry-failed"' in html
    assert f'hx-get="/jobs/{shards[2]["id"]}/logs/?after=0"' in html  # each shard's log

    url = f"/jobs/{root}/array/retry/"
    assert browser.post(url).status_code == 403  # no CSRF token
    token = browser.cookies["csrftoken"].value
    assert browser.post(url, {"csrfmiddlewaretoken": token}).status_code == 302
    assert Job.objects.get(pk=shards[2]["id"]).state == JobState.QUEUED
    assert Job.objects.get(pk=root).state == JobState.SUCCEEDED

    viewer = Client()
    viewer.force_login(team["viewer"])
    html = viewer.get(f"/jobs/{root}/array/").content.decode()
    assert 'data-testid="retry-failed"' not in html
    outsider = Client()
    outsider.force_login(team["outsider"])
    assert outsider.get(f"/jobs/{root}/array/").status_code == 404


def test_the_dry_run_says_the_job_waits_for_its_dependencies(team, fleet, api):
    first = submit(api, team["member"]).json()["id"]
    body = {
        "project": "alpha",
        "name": "m",
        "command": "true",
        "dependencies": [{"type": "after_ok", "job": first}],
    }
    resp = api(team["member"]).post("/api/v1/jobs/dry-run", body, format="json")
    assert resp.status_code == 200, resp.content
    data = resp.json()
    assert data["would_start_now"] is False
    assert data["wait_message"].startswith(
        f"It starts only after its dependencies (after_ok:{first})"
    )
