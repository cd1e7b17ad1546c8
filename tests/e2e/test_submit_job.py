"""A researcher submits a job through the form in a real browser and watches it reach running."""

from __future__ import annotations

import re

import pytest

from scheduler.models import Job, JobState
from tests.polling import wait_for
from tests.stack_fixtures import wait_for_registration

pytestmark = [pytest.mark.e2e, pytest.mark.celery, pytest.mark.django_db(transaction=True)]


def test_submit_through_the_form_and_watch_it_run(page, celery_live_worker, agents, team, fleet):
    for name in ("h1", "h2"):
        agents.start(name, fleet["tokens"][name], "2xH100-80GB-SXM")
    wait_for_registration(["h1", "h2"])
    member = team["member"]
    member.set_password("pw-browser-1")
    member.save()

    page.goto("/login/")
    page.fill("#id_username", member.email)
    page.fill("#id_password", "pw-browser-1")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))

    page.click("nav >> text=Submit")
    page.wait_for_url("**/jobs/new/")
    picker = page.get_by_test_id("model-picker")
    assert "H100-80GB-SXM" in picker.inner_text()
    page.select_option("#id_project", "alpha")
    page.fill("#id_name", "browser-job")
    page.fill("#id_command", "echo step 1; sleep 2; echo step 2; sleep 120")
    page.check("#gm-H100-80GB-SXM")
    page.fill("#id_gpus", "2")
    page.fill("#id_runtime_estimate_h", "1")
    # The dry run fills in the cost and the estimated start as the form changes.
    page.wait_for_function(
        "() => document.querySelector('[data-testid=dry-run]').innerText.includes('per hour')"
    )
    assert "$7.00" in page.get_by_test_id("dry-run").inner_text()
    page.get_by_test_id("submit").click()
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    job = Job.objects.get(name="browser-job")

    # The status panel polls; it shows Running once the agent has started the process.
    wait_for(lambda: Job.objects.get(pk=job.pk).state == JobState.RUNNING, timeout=30)
    page.wait_for_function(
        "() => document.querySelector('[data-testid=job-status]').innerText.includes('Running')",
        timeout=10_000,
    )
    assert re.search(r"\bh[12]\b", page.get_by_test_id("placement").inner_text())
    page.wait_for_function(
        "() => document.querySelector('[data-testid=logs]').innerText.includes('step 2')",
        timeout=20_000,
    )
    assert page.get_by_test_id("logs").inner_text().startswith("step 1\nstep 2")
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_test_id("cancel").click()
    page.wait_for_function(
        "() => document.querySelector('[data-testid=job-status]').innerText.includes('Cancelled')"
    )
    assert Job.objects.get(pk=job.pk).state == JobState.CANCELLED
