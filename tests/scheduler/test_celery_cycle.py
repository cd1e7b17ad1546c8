"""The scheduling cycle runs as a Celery task on a real worker with real Redis and PostgreSQL."""

from __future__ import annotations

import time

import pytest

from scheduler.models import Job, JobState
from scheduler.tasks import scheduling_cycle
from tests.polling import wait_for

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def test_submission_triggers_a_cycle_on_the_worker(celery_live_worker, team, fleet, api):
    resp = api(team["member"]).post(
        "/api/v1/jobs",
        {"project": "alpha", "name": "w", "command": "true", "gpus": 2},
        format="json",
    )
    job_id = resp.json()["id"]
    # Nothing here runs the cycle: the task enqueued after commit does, on the worker.
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.SCHEDULED)


def test_cycle_is_single_flight(celery_live_worker, team, fleet):
    from portal.locks import single_flight

    with single_flight("scheduler-cycle", ttl=30) as held:
        assert held
        assert scheduling_cycle.apply().get() is None  # another holder: this cycle is a no-op
    assert scheduling_cycle.apply().get() == {"placed": 0, "preempted": 0, "pending": 0}


@pytest.mark.django_db
def test_cycle_requests_coalesce_while_one_is_queued(settings):
    from portal.locks import redis_client
    from scheduler.cycle_requests import request_cycle

    queue = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] + "scheduler"
    client = redis_client()
    client.delete(queue)
    for _ in range(3):
        request_cycle()
    assert client.llen(queue) == 1
    client.delete(queue)


def test_a_request_that_finds_a_cycle_running_is_served_after_it(
    celery_live_worker, team, fleet, api
):
    """The running cycle may have read the queue before the job: another cycle follows it,
    with no beat and no further request (this test's worker runs no beat)."""
    from portal.locks import single_flight

    with single_flight("scheduler-cycle", ttl=30) as held:  # a cycle "running" elsewhere
        assert held
        resp = api(team["member"]).post(
            "/api/v1/jobs",
            {"project": "alpha", "name": "late", "command": "true", "gpus": 1},
            format="json",
        )
        job_id = resp.json()["id"]
        wait_for(lambda: Job.objects.filter(pk=job_id).exists())
        time.sleep(1.0)  # the requested cycle found the lock taken
        assert Job.objects.get(pk=job_id).state == JobState.QUEUED
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.SCHEDULED, timeout=10)
