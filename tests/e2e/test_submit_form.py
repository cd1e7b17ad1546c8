"""The submit form in Chromium at 1400 × 1000: Submit stays reachable at the bottom of the long
form (the panel is sticky), and a dry run that says "would be rejected" turns Submit off while
every input keeps its value."""

from __future__ import annotations

import re

import pytest

from scheduler.models import Job, Quota
from storage.models import Volume

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

VIEWPORT = {"width": 1400, "height": 1000}


def _log_in(page, user) -> None:
    user.set_password("pw-browser-1")
    user.save()
    page.set_viewport_size(VIEWPORT)
    page.goto("/login/")
    page.fill("#id_username", user.email)
    page.fill("#id_password", "pw-browser-1")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def _in_viewport(page, test_id: str) -> bool:
    box = page.get_by_test_id(test_id).bounding_box()
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= VIEWPORT["height"]


def test_submit_is_reachable_at_the_bottom_of_the_form(page, team, fleet):
    _log_in(page, team["member"])
    page.goto("/jobs/new/")
    height = page.evaluate("() => document.documentElement.scrollHeight")
    assert height > VIEWPORT["height"] + 300  # the form is longer than the window
    assert _in_viewport(page, "submit")
    page.evaluate("() => window.scrollTo(0, document.documentElement.scrollHeight)")
    page.wait_for_function("() => window.scrollY > 0")
    assert page.evaluate("() => window.scrollY") > 300
    # at the bottom of the form, beside the last field, the panel's Submit is still on screen
    assert _in_viewport(page, "submit")
    env_box = page.locator("#id_env").bounding_box()
    assert env_box is not None and env_box["y"] < VIEWPORT["height"]


def test_a_rejected_dry_run_turns_submit_off_and_keeps_every_input(page, team, fleet):
    Quota.objects.filter(project=team["a"]).update(max_gpus=2, allow_borrowing=False)
    Volume.objects.create(project=team["a"], name="ckpt", kind="shared", size_gib=1)
    _log_in(page, team["member"])
    page.goto("/jobs/new/")
    page.select_option("#id_project", "alpha")
    page.fill("#id_name", "too-big")
    page.fill("#id_command", "python train.py --epochs 3")
    page.fill("#id_image", "localhost/gpucloud-job:latest")
    page.check("#gm-H100-80GB-SXM")
    page.fill("#id_runtime_estimate_h", "2")
    page.fill("#id_checkpoint", "ckpt:too-big")
    page.fill("#id_env", "SEED=7\nMODE=full")
    page.fill("#id_gpus", "4")
    page.locator("#id_gpus").dispatch_event("change")
    page.wait_for_function(
        "() => document.querySelector('[data-testid=dry-run]').innerText"
        ".includes('would be rejected')"
    )
    submit = page.get_by_test_id("submit")
    assert submit.is_disabled()
    assert "would be rejected" in page.get_by_test_id("submit-note").inner_text()
    # every input is as the researcher left it
    assert page.input_value("#id_project") == "alpha"
    assert page.input_value("#id_name") == "too-big"
    assert page.input_value("#id_command") == "python train.py --epochs 3"
    assert page.input_value("#id_image") == "localhost/gpucloud-job:latest"
    assert page.is_checked("#gm-H100-80GB-SXM")
    assert page.input_value("#id_gpus") == "4"
    assert page.input_value("#id_runtime_estimate_h") == "2"
    assert page.input_value("#id_checkpoint") == "ckpt:too-big"
    assert page.input_value("#id_env") == "SEED=7\nMODE=full"
    # pressing Enter in a field does not submit it either
    page.locator("#id_name").press("Enter")
    assert Job.objects.count() == 0

    # fits the quota again: Submit is back and submits what the form says
    page.fill("#id_gpus", "2")
    page.locator("#id_gpus").dispatch_event("change")
    page.wait_for_function(
        "() => !document.querySelector('[data-testid=submit]').disabled"
        " && document.querySelector('[data-testid=dry-run]').innerText.includes('admitted')"
    )
    submit.click()
    page.wait_for_url(re.compile(r".*/jobs/\d+/$"))
    job = Job.objects.get()
    assert (job.name, job.gpus, job.image, job.env) == (
        "too-big",
        2,
        "localhost/gpucloud-job:latest",
        {"SEED": "7", "MODE": "full"},
    )
