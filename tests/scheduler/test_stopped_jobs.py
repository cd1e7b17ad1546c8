"""A job the platform or its user stopped ends as what stopped it, even when its process
checkpoints on SIGTERM and exits 0 within the grace: cancelled, preempted (requeued), resized,
over its time limit, stopped by its node. Only an exit the agent did not cause is a success."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from scheduler.admission import job_cancel
from scheduler.cycle import run_cycle
from scheduler.elastic import job_resize_request
from scheduler.models import Allocation, Job, JobEvent, JobMember, JobState
from scheduler.transitions import job_transition
from tests.scheduler.test_gangs_and_resize import exit_on, start_everywhere, submit

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("ckpt_volume")]


def running_job(team, **spec) -> tuple[Job, object]:
    job = submit(team, name="j", **spec)
    run_cycle()
    start_everywhere(job)
    job.refresh_from_db()
    assert job.state == JobState.RUNNING
    return job, Allocation.objects.filter(job=job).first().node


def preempt(job: Job) -> None:
    job.refresh_from_db()
    job.preempt_deadline = timezone.now() + timedelta(seconds=job.grace_seconds)
    job_transition(
        job=job,
        to=JobState.PREEMPTING,
        reason="Preempted for job 0: test",
        actor_label="scheduler",
        update_fields=("preempt_deadline",),
    )


def never_succeeded(job: Job) -> bool:
    return not JobEvent.objects.filter(job=job, to_state=JobState.SUCCEEDED).exists()


def test_a_job_over_its_time_limit_that_exits_zero_on_sigterm_fails_as_time_limit(team, fleet):
    job, node = running_job(team, time_limit_s=60)
    ended = exit_on(job, node, 0, "time_limit")
    assert ended.state == JobState.FAILED and never_succeeded(job)
    assert "time limit" in ended.failure_reason


def test_a_preempted_job_that_checkpoints_and_exits_zero_is_requeued(team, fleet):
    job, node = running_job(team, checkpoint="ckpt:ckpt")
    preempt(job)
    ended = exit_on(job, node, 0, "preempted")
    assert ended.state == JobState.QUEUED and ended.resume and never_succeeded(job)


def test_a_resized_job_that_checkpoints_and_exits_zero_restarts_at_its_new_size(team, fleet, api):
    job, node = running_job(team, gpus=2, elastic_min=1, elastic_max=2, checkpoint="ckpt:c")
    job_resize_request(actor=team["member"], job=job, gpus=1)
    ended = exit_on(job, node, 0, "preempted")
    assert ended.state == JobState.SCHEDULED and ended.gpus == 1 and ended.resume
    assert never_succeeded(job)


def test_a_cancelled_job_that_exits_zero_in_its_grace_stays_cancelled(team, fleet):
    job, node = running_job(team)
    job_cancel(actor=team["member"], job=job)
    # its agent stops it ("no longer assigned"): the workload exits 0 on SIGTERM
    assert exit_on(job, node, 0, "killed").state == JobState.CANCELLED
    assert never_succeeded(job)


def test_a_job_its_node_stopped_is_not_a_success_even_with_exit_zero(team, fleet):
    job, node = running_job(team)
    ended = exit_on(job, node, 0, "killed")
    assert ended.state == JobState.FAILED and never_succeeded(job)
    assert "stop by its node" in ended.failure_reason


def test_a_job_that_finished_before_its_preemption_reached_it_succeeded(team, fleet):
    """The agent had not stopped it yet (reason `exited`): it finished its work, so it is
    neither run again nor resumed."""
    job, node = running_job(team, checkpoint="ckpt:ckpt")
    preempt(job)
    ended = exit_on(job, node, 0, "exited")
    assert ended.state == JobState.SUCCEEDED and ended.preempt_deadline is None
    assert "before its preemption reached it" in ended.events.last().reason


def test_a_gang_over_its_time_limit_fails_whole_even_when_members_exit_zero(team, fleet):
    job = submit(team, name="g", gpus=2, nodes=2, gpus_per_node=1, time_limit_s=60)
    run_cycle()
    start_everywhere(job)
    m0, m1 = JobMember.objects.filter(job=job).order_by("rank")
    ended = exit_on(job, m0.node, 0, "time_limit")
    assert ended.state == JobState.FAILED and "time limit" in ended.failure_reason
    assert exit_on(job, m1.node, 0, "time_limit").state == JobState.FAILED
    assert never_succeeded(job)
    assert dict(JobMember.objects.filter(job=job).values_list("rank", "state")) == {
        0: "failed",
        1: "stopped",
    }


def test_a_preempted_gang_whose_members_exit_zero_is_requeued_whole(team, fleet):
    job = submit(team, name="g", gpus=2, nodes=2, gpus_per_node=1, checkpoint="ckpt:ckpt")
    run_cycle()
    start_everywhere(job)
    m0, _m1 = JobMember.objects.filter(job=job).order_by("rank")
    preempt(job)
    ended = exit_on(job, m0.node, 0, "preempted")
    assert ended.state == JobState.QUEUED and ended.resume and never_succeeded(job)
