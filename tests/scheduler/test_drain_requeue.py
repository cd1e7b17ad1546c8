"""A drain as the researchers see it: waiting jobs are told their nodes are draining (not that
nothing can ever run them), and the preempted job keeps its place in the queue and says so."""

from __future__ import annotations

import pytest

from scheduler.cycle import run_cycle
from scheduler.models import Job, JobState, Node
from scheduler.nodes.operator import node_set_state
from scheduler.transitions import job_transition

pytestmark = pytest.mark.django_db


def test_a_drain_keeps_the_preempted_jobs_place_and_says_draining(
    placed, team, fleet, api, make_user, client
):
    operator = make_user(staff=True)
    first = placed["job"]
    for name in ("h1", "h2"):  # every H100 node
        node_set_state(actor=operator, node=Node.objects.get(name=name), action="drain")
    assert Job.objects.get(pk=first.pk).state == JobState.PREEMPTING
    body = {"project": "alpha", "name": "later", "command": "true", "gpu_model": "H100-80GB-SXM"}
    later = Job.objects.get(
        pk=api(team["member"]).post("/api/v1/jobs", body, format="json").json()["id"]
    )
    # the agent confirms the stop: the job is requeued
    job_transition(
        job=Job.objects.get(pk=first.pk), to=JobState.QUEUED, reason="Stopped for the drain"
    )
    run_cycle()

    first, later = Job.objects.get(pk=first.pk), Job.objects.get(pk=later.pk)
    assert first.queued_at < later.queued_at
    assert first.queue_position < later.queue_position  # it kept its place
    for job in (first, later):
        assert job.pending_reason == "nodes_unavailable"
        assert "draining" in job.pending_message and "can ever" not in job.pending_message

    client.force_login(team["member"])
    page = client.get(f"/jobs/{first.pk}/").content.decode()
    assert 'data-testid="requeued"' in page and "kept its place in the queue" in page
    assert "draining" in page
    assert 'data-testid="requeued"' not in client.get(f"/jobs/{later.pk}/").content.decode()
