"""The agent's /sync round trip: reports and assignments, the unchanged fast path, its limits."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from scheduler.models import Allocation, Job, JobEvent, JobState
from scheduler.nodes import node_issue_agent_token

pytestmark = pytest.mark.django_db

SYNC = "/api/agent/v1/sync"


def agent(token: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


def test_sync_answers_assignments_then_unchanged_without_sql(
    placed, django_assert_num_queries, django_capture_on_commit_callbacks
):
    client, job = placed["client"], placed["job"]
    first = client.post(SYNC, {}, format="json").json()
    assert first["unchanged"] is False and first["fenced"] is False
    assert [a["job_id"] for a in first["assignments"]] == [job.pk]
    with django_assert_num_queries(0):  # nothing new: no SQL at all
        again = client.post(SYNC, {"version": first["version"]}, format="json").json()
    assert again == {"unchanged": True, "version": first["version"], "results": []}

    # Cancelling the job changes the node's assignments: the old version is no longer current.
    with django_capture_on_commit_callbacks(execute=True):
        from scheduler.admission import job_cancel

        job_cancel(actor=job.submitted_by, job=job)
    after = client.post(SYNC, {"version": first["version"]}, format="json").json()
    assert after["unchanged"] is False and after["assignments"] == []
    assert after["version"] != first["version"]


def test_sync_reports_a_start_like_the_started_endpoint(placed):
    client, job = placed["client"], placed["job"]
    body = {"reports": [{"kind": "started", "job_id": job.pk, "attempt": 1, "pid": 42}]}
    answer = client.post(SYNC, body, format="json").json()
    assert answer["results"] == [
        {"kind": "started", "job_id": job.pk, "attempt": 1, "state": JobState.RUNNING}
    ]
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.started_at is not None
    event = JobEvent.objects.filter(job=job).latest("pk")
    assert (event.from_state, event.to_state) == (JobState.SCHEDULED, JobState.RUNNING)
    assert event.actor_label == f"agent:{placed['node'].name}" and event.data["pid"] == 42
    # Sent again (a retry): answered the same, and no second transition.
    again = client.post(SYNC, body, format="json").json()
    assert again["results"][0]["state"] == JobState.RUNNING
    assert JobEvent.objects.filter(job=job, to_state=JobState.RUNNING).count() == 1


def test_sync_reports_an_exit_and_the_job_ends(placed):
    client, job = placed["client"], placed["job"]
    reports = [
        {"kind": "started", "job_id": job.pk, "attempt": 1},
        {"kind": "exited", "job_id": job.pk, "attempt": 1, "exit_code": 0, "reason": "exited"},
    ]
    answer = client.post(SYNC, {"reports": reports}, format="json").json()
    assert [r["state"] for r in answer["results"]] == [JobState.RUNNING, JobState.SUCCEEDED]
    assert answer["assignments"] == []
    assert not Allocation.objects.filter(job=job, ended_at__isnull=True).exists()


def test_a_node_token_cannot_touch_another_nodes_job(placed):
    other, job = placed["other"], placed["job"]
    reports = [
        {"kind": "started", "job_id": job.pk, "attempt": 1},
        {"kind": "exited", "job_id": job.pk, "attempt": 1, "exit_code": 1, "reason": "exited"},
    ]
    answer = other.post(SYNC, {"reports": reports}, format="json").json()
    assert [r.get("conflict") for r in answer["results"]] == [
        "This node does not run that job attempt.",
        "This node does not run that job attempt.",
    ]
    assert answer["assignments"] == []  # and it does not see the other node's work
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED


def test_a_stale_attempt_is_a_conflict_and_does_not_undo_the_others(placed, fleet):
    client, job = placed["client"], placed["job"]
    reports = [
        {"kind": "started", "job_id": job.pk, "attempt": 2},  # not this job's attempt
        {"kind": "started", "job_id": job.pk, "attempt": 1},
    ]
    results = client.post(SYNC, {"reports": reports}, format="json").json()["results"]
    assert "conflict" in results[0] and results[1]["state"] == JobState.RUNNING


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"reports": [{"kind": "started", "job_id": 1, "attempt": 1, "extra": 1}]}, "reports"),
        ({"reports": [{"kind": "exited", "job_id": 1, "attempt": 1}]}, "reports"),
        ({"reports": [{"kind": "started", "job_id": 1, "attempt": 1, "exit_code": 0}]}, "reports"),
        ({"reports": [{"kind": "logs", "job_id": 1, "attempt": 1}]}, "reports"),
        ({"reports": [{"kind": "started", "job_id": 0, "attempt": 1}]}, "reports"),
        ({"reports": {"kind": "started"}}, "reports"),
        ({"reports": [{"kind": "started", "job_id": 1, "attempt": 1}] * 501}, "reports"),
        ({"version": "not-hex!"}, "version"),
        ({"assignments": "maybe"}, "assignments"),
        ({"surprise": True}, "surprise"),
    ],
)
def test_bad_sync_payloads_get_a_400_naming_the_field(placed, body, field):
    resp = placed["client"].post(SYNC, body, format="json")
    assert resp.status_code == 400
    assert field in resp.json()


def test_a_token_issued_anew_stops_working_at_once(placed, django_capture_on_commit_callbacks):
    client, node = placed["client"], placed["node"]
    assert client.post(SYNC, {}, format="json").status_code == 200  # now remembered in the cache
    with django_capture_on_commit_callbacks(execute=True):
        node_issue_agent_token(node=node)
    assert client.post(SYNC, {}, format="json").status_code == 401


def test_a_write_checks_the_token_in_the_database_even_when_the_cache_vouches(placed):
    client, node, job = placed["client"], placed["node"], placed["job"]
    assert client.post(SYNC, {}, format="json").status_code == 200  # remembered in the cache
    node_issue_agent_token(node=node)  # its commit hook (forget the old token) never runs here
    body = {"reports": [{"kind": "started", "job_id": job.pk, "attempt": 1}]}
    assert client.post(SYNC, body, format="json").status_code == 401
    assert (
        client.post(
            "/api/agent/v1/heartbeat", {"telemetry": [], "running": []}, format="json"
        ).status_code
        == 401
    )
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED


def test_only_reports_when_the_agent_wants_no_assignments(placed):
    client, job = placed["client"], placed["job"]
    body = {"reports": [{"kind": "started", "job_id": job.pk, "attempt": 1}], "assignments": False}
    answer = client.post(SYNC, body, format="json").json()
    assert set(answer) == {"results"} and answer["results"][0]["state"] == JobState.RUNNING


def test_a_report_of_an_attempt_the_node_ran_before_says_that_attempt_is_over(placed):
    client, job = placed["client"], placed["job"]
    Job.objects.filter(pk=job.pk).update(attempt=2)  # restarted; attempt 1 was on this node
    reports = [
        {"kind": "started", "job_id": job.pk, "attempt": 1},  # held here once: over
        {"kind": "started", "job_id": job.pk, "attempt": 2},  # never held here
    ]
    results = client.post(SYNC, {"reports": reports}, format="json").json()["results"]
    assert [r.get("conflict") for r in results] == [
        "That attempt of the job is over.",
        "This node does not run that job attempt.",
    ]
    job.refresh_from_db()
    assert job.state == JobState.SCHEDULED


def test_a_sync_of_starts_is_one_locking_read_and_keeps_the_version_it_was_sent(
    placed, django_assert_num_queries, django_capture_on_commit_callbacks
):
    client, job = placed["client"], placed["job"]
    version = client.post(SYNC, {}, format="json").json()["version"]
    body = {
        "version": version,
        "reports": [{"kind": "started", "job_id": job.pk, "attempt": 1, "pid": 7}],
    }
    # the node (its token checked), the transaction's savepoint, the jobs locked with whether
    # the node holds their attempts, their update, their events, the savepoint's release
    with django_assert_num_queries(6), django_capture_on_commit_callbacks(execute=True):
        answer = client.post(SYNC, body, format="json").json()
    # a start leaves the node's assignments as they were: its version still holds
    assert answer == {
        "unchanged": True,
        "version": version,
        "results": [{"kind": "started", "job_id": job.pk, "attempt": 1, "state": "running"}],
    }
    assert JobEvent.objects.get(job=job, to_state=JobState.RUNNING).data == {
        "pid": 7,
        "attempt": 1,
    }


def test_a_sync_of_an_exit_locks_the_job_once_and_reads_its_nodes_once(
    placed, django_assert_num_queries
):
    client, job, node = placed["client"], placed["job"], placed["node"]
    start = {"kind": "started", "job_id": job.pk, "attempt": 1}
    client.post(SYNC, {"reports": [start]}, format="json")
    exited = {"kind": "exited", "job_id": job.pk, "attempt": 1, "exit_code": 0, "reason": "exited"}
    # the node; the report's transaction: the job locked with whether the node holds that
    # attempt, the transition's savepoint, its state lock, the job's update, its open
    # allocations' nodes (read once), their end, its event, both releases; then the answer in
    # full: the node again (after the version is minted) and its assignments
    with django_assert_num_queries(13):
        answer = client.post(SYNC, {"reports": [exited]}, format="json").json()
    assert answer["results"][0]["state"] == JobState.SUCCEEDED
    assert answer["unchanged"] is False and answer["assignments"] == []
    alloc = Allocation.objects.get(job=job)
    assert alloc.node == node and alloc.ended_at is not None and alloc.end_reason == "completed"
    event = JobEvent.objects.filter(job=job).latest("pk")
    assert (event.to_state, event.actor_label) == (JobState.SUCCEEDED, f"agent:{node.name}")
