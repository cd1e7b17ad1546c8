"""The portal restarted under its agents: they ride it out and nothing is lost or run twice."""

from __future__ import annotations

import time

import pytest

from scheduler.admission import JobSpec, job_submit
from scheduler.cycle import run_cycle
from scheduler.models import Job, JobState, LogChunk, Node
from tests.hardening.invariants import assert_invariants
from tests.polling import wait_for
from tests.stack_fixtures import Agents, Web, wait_for_registration

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def test_agents_ride_out_a_portal_restart(team, fleet, tmp_path):
    Node.objects.exclude(name="h1").update(state=Node.State.CORDONED)
    web = Web(tmp_path / "web.log")
    web.start()
    agents = Agents(web.url, tmp_path)
    try:
        agents.start("h1", fleet["tokens"]["h1"], "2xH100-80GB-SXM")
        wait_for_registration(["h1"])
        job = job_submit(
            actor=team["member"],
            project=team["a"],
            spec=JobSpec(name="through-restart", command="echo start; sleep 2; echo done", gpus=2),
        )[0]
        run_cycle()
        wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, timeout=30)

        web.stop()  # the portal goes away while the job runs ...
        time.sleep(6)  # the job exits meanwhile: its report and last logs wait in the agent
        assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
        web.start()  # ... and comes back; the agent reports what happened meanwhile

        wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.SUCCEEDED, timeout=60)
        final = Job.objects.get(pk=job.pk)
        assert final.exit_code == 0 and final.attempt == 1  # ran once, not restarted
        text = "".join(LogChunk.objects.filter(job=final).values_list("text", flat=True))
        assert "start" in text and "done" in text
        assert_invariants()
    finally:
        agents.stop_all()
        web.stop()
