"""The scheduling cycle runs as a Celery task on a real worker with real Redis and PostgreSQL."""

from __future__ import annotations

import pytest

from scheduler.models import Job, JobState
from scheduler.tasks import scheduling_cycle
from tests.polling import wait_for

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


class CycleRuns:
    """Cycle tasks the worker has begun and finished (Celery's task signals), while in use."""

    def __init__(self) -> None:
        self.begun: list[str] = []
        self.finished: list[str] = []

    def _prerun(self, sender=None, **_kw):  # type: ignore[no-untyped-def]
        if sender is not None and sender.name == "scheduler.cycle":
            self.begun.append(sender.name)

    def _postrun(self, sender=None, **_kw):  # type: ignore[no-untyped-def]
        if sender is not None and sender.name == "scheduler.cycle":
            self.finished.append(sender.name)

    def __enter__(self) -> CycleRuns:
        from celery.signals import task_postrun, task_prerun

        task_prerun.connect(self._prerun, weak=False)
        task_postrun.connect(self._postrun, weak=False)
        return self

    def __exit__(self, *exc: object) -> None:
        from celery.signals import task_postrun, task_prerun

        task_prerun.disconnect(self._prerun)
        task_postrun.disconnect(self._postrun)


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
    from foundation.locks import single_flight

    with single_flight("scheduler-cycle", ttl=30) as held:
        assert held
        assert scheduling_cycle.apply().get() is None  # another holder: this cycle is a no-op
    assert scheduling_cycle.apply().get() == {"placed": 0, "preempted": 0, "pending": 0}


@pytest.mark.django_db
def test_cycle_requests_coalesce_while_one_is_queued(settings):
    from foundation.locks import redis_client
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
    from foundation.locks import single_flight

    with CycleRuns() as runs, single_flight("scheduler-cycle", ttl=30) as held:
        assert held  # a cycle "running" elsewhere
        resp = api(team["member"]).post(
            "/api/v1/jobs",
            {"project": "alpha", "name": "late", "command": "true", "gpus": 1},
            format="json",
        )
        job_id = resp.json()["id"]
        wait_for(lambda: runs.finished)  # the requested cycle ran and found the lock taken
        assert Job.objects.get(pk=job_id).state == JobState.QUEUED
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.SCHEDULED, timeout=10)


def _cycle_queue(settings):  # type: ignore[no-untyped-def]
    from django.core.cache import cache

    from foundation.locks import redis_client
    from scheduler.cycle_requests import CYCLE_DIRTY, CYCLE_REQUESTED

    cache.delete_many([CYCLE_REQUESTED, CYCLE_DIRTY])
    queue = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] + "scheduler"
    client = redis_client()
    client.delete(queue)
    return lambda: client.llen(queue), lambda: client.delete(queue)


@pytest.mark.django_db
def test_requests_while_a_cycle_runs_send_no_task_and_make_it_plan_again(settings):
    from scheduler import cycle_requests
    from scheduler.cycle_requests import request_cycle

    sent, clear = _cycle_queue(settings)
    cycle_requests.pass_begin()  # a cycle is running, past its read of the queue
    assert not cycle_requests.requested_since_pass()
    for _ in range(3):
        request_cycle()
    assert sent() == 0
    assert cycle_requests.requested_since_pass()  # it plans once more after this pass
    cycle_requests.pass_begin()  # that pass reads the queue, with every request in it
    assert not cycle_requests.requested_since_pass()
    assert not cycle_requests.requests_release()  # nothing came since: it sends nothing
    request_cycle()
    assert sent() == 1  # no cycle running: a request sends the task
    clear()


@pytest.mark.django_db
def test_a_request_that_comes_as_a_cycle_finishes_gets_a_task(settings):
    from scheduler import cycle_requests
    from scheduler.cycle_requests import request_cycle

    sent, clear = _cycle_queue(settings)
    cycle_requests.pass_begin()
    assert not cycle_requests.requested_since_pass()  # its last look: nothing new
    request_cycle()  # still the running cycle's flag: the request sends nothing itself
    assert sent() == 0
    assert cycle_requests.requests_release()  # so the finishing cycle sends a task for it
    request_cycle()
    assert sent() == 0  # later requests coalesce onto that task
    clear()


def test_a_job_submitted_during_a_pass_is_planned_by_the_same_task(
    celery_live_worker, team, fleet, api, settings
):
    """One task message for a burst: the running cycle plans again for what came meanwhile."""
    from foundation.locks import redis_client
    from scheduler import ports
    from scheduler.admission import JobSpec, job_submit

    later: list[int] = []

    def submit_during_the_pass(**_kw):  # type: ignore[no-untyped-def]
        if not later:  # a submit that arrives after this pass read the queue
            job = job_submit(
                actor=team["member"],
                project=team["a"],
                spec=JobSpec(name="later", command="true", gpus=1),
            )[0]
            later.append(job.pk)

    queue = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] + "scheduler"
    with CycleRuns() as runs, ports.CYCLE_LISTENERS.override([submit_during_the_pass]):
        resp = api(team["member"]).post(
            "/api/v1/jobs",
            {"project": "alpha", "name": "first", "command": "true", "gpus": 1},
            format="json",
        )
        first = resp.json()["id"]
        wait_for(lambda: Job.objects.get(pk=first).state == JobState.SCHEDULED)
        wait_for(lambda: later and Job.objects.get(pk=later[0]).state == JobState.SCHEDULED)
        wait_for(lambda: runs.finished)  # the one task has ended ...
        # ... and no second message waits for the worker: the burst took one task.
        assert redis_client().llen(queue) == 0
    assert runs.begun == ["scheduler.cycle"]


@pytest.mark.django_db
def test_a_cycle_that_fails_hands_its_requests_back(settings, team, fleet):
    """A pass that raises still lets requests through: the one that came during it gets a task."""
    from scheduler import ports
    from scheduler.cycle_requests import request_cycle

    sent, clear = _cycle_queue(settings)

    def fails_after_a_request(**_kw):  # type: ignore[no-untyped-def]
        request_cycle()  # a submit during the pass
        raise RuntimeError("the pass failed")

    with ports.CYCLE_LISTENERS.override([fails_after_a_request]), pytest.raises(RuntimeError):
        scheduling_cycle.apply(throw=True)
    assert sent() == 1
    request_cycle()
    assert sent() == 1  # coalesced onto that task
    clear()
