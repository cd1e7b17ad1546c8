"""Job pages: the form with its dry run, list and detail, logs, cancel."""

from __future__ import annotations

import pytest

from scheduler.cycle import run_cycle
from scheduler.models import Job, JobState, LogChunk

pytestmark = pytest.mark.django_db


@pytest.fixture
def logged_in(client, team, fleet):
    client.force_login(team["member"])
    return client


FORM = {
    "project": "alpha",
    "name": "train",
    "command": "python train.py",
    "gpu_model": "H100-80GB-SXM",
    "shape": "whole",
    "gpus": "2",
    "priority": "1",
    "runtime_estimate_h": "2",
    "shard_count": "1",
    "max_restarts": "0",
}


def test_form_shows_models_with_availability_and_price(logged_in):
    html = logged_in.get("/jobs/new/").content.decode()
    assert 'data-testid="model-picker"' in html
    assert "H100-80GB-SXM" in html and "4 / 4" in html and "3.50" in html


def test_form_submits_a_job(logged_in):
    resp = logged_in.post("/jobs/new/", FORM)
    job = Job.objects.get()
    assert resp.status_code == 302 and resp["Location"] == f"/jobs/{job.pk}/"
    assert (job.gpus, job.gpu_model.name, job.source, job.runtime_estimate_s) == (
        2,
        "H100-80GB-SXM",
        "form",
        7200,
    )
    assert job.state == JobState.QUEUED


def test_form_errors_are_shown_next_to_fields(logged_in):
    resp = logged_in.post("/jobs/new/", {**FORM, "gpu_model": "T4", "precisions": ["bf16"]})
    assert resp.status_code == 400
    assert "T4 does not support bf16" in resp.content.decode()
    resp = logged_in.post("/jobs/new/", {**FORM, "env": "NOEQUALS"})
    assert "Line 1: write KEY=value." in resp.content.decode()
    assert Job.objects.count() == 0


def test_dry_run_panel(logged_in):
    html = logged_in.post("/jobs/dry-run/", FORM, HTTP_HX_REQUEST="true").content.decode()
    assert "$7.00" in html and "$14.00" in html and "now" in html
    html = logged_in.post(
        "/jobs/dry-run/", {**FORM, "gpus": "0"}, HTTP_HX_REQUEST="true"
    ).content.decode()
    assert "<strong>GPUs</strong>: Ensure this value is greater than or equal to 1." in html
    assert "$" not in html


def test_list_detail_logs_and_cancel(logged_in, team, client):
    logged_in.post("/jobs/new/", FORM)
    job = Job.objects.get()
    run_cycle()
    html = logged_in.get("/jobs/").content.decode()
    assert f"#{job.pk} train" in html
    partial = logged_in.get("/jobs/?state=scheduled", HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial and f"#{job.pk}" in partial
    assert logged_in.get("/jobs/?state=bogus").status_code == 400
    detail = logged_in.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="placement"' in detail and "Scheduled" in detail
    LogChunk.objects.create(job=job, attempt=1, seq=0, text="epoch 1 <b>\n")
    tail = logged_in.get(f"/jobs/{job.pk}/logs/?after=0").content.decode()
    assert "epoch 1 &lt;b&gt;" in tail
    download = logged_in.get(f"/jobs/{job.pk}/logs/download/")
    assert b"".join(download.streaming_content) == b"epoch 1 <b>\n"
    logged_in.post(f"/jobs/{job.pk}/cancel/")
    assert Job.objects.get().state == JobState.CANCELLED
    client.force_login(team["outsider"])
    assert client.get(f"/jobs/{job.pk}/").status_code == 404
    assert client.get(f"/jobs/{job.pk}/logs/download/").status_code == 404


def test_queued_job_page_says_why_it_waits(logged_in, api, team):
    for _ in range(2):
        logged_in.post("/jobs/new/", FORM)
    logged_in.post("/jobs/new/", {**FORM, "name": "waiter"})
    run_cycle()
    waiter = Job.objects.get(name="waiter")
    html = logged_in.get(f"/jobs/{waiter.pk}/").content.decode()
    assert 'data-testid="pending"' in html
    assert waiter.pending_message and waiter.pending_message.split(";")[0] in html


def test_home_dashboard_shows_my_jobs_and_usage(logged_in):
    logged_in.post("/jobs/new/", FORM)
    run_cycle()
    html = logged_in.get("/").content.decode()
    assert "train" in html and "Concurrent GPUs" in html and "2 / " in html


def test_an_ended_job_stops_the_status_poll_and_one_that_never_ran_shows_no_charts(logged_in):
    logged_in.post("/jobs/new/", FORM)
    job = Job.objects.get()
    run_cycle()
    page = logged_in.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-push="job" data-push-topic="job=' in page and 'data-testid="logs"' in page
    assert logged_in.get(f"/jobs/{job.pk}/", HTTP_HX_REQUEST="true").status_code == 200
    logged_in.post(f"/jobs/{job.pk}/cancel/")
    poll = logged_in.get(f"/jobs/{job.pk}/", HTTP_HX_REQUEST="true")
    # 286: htmx swaps this last status in and polls no more
    assert poll.status_code == 286 and "Cancelled" in poll.content.decode()
    page = logged_in.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-push="job"' not in page
    assert 'data-testid="logs"' in page and 'data-testid="never-ran"' not in page  # it held GPUs

    rejected = {**FORM, "name": "too-big", "gpus": "64"}
    logged_in.post("/jobs/new/", rejected)
    job = Job.objects.get(name="too-big")
    assert job.state == JobState.REJECTED
    page = logged_in.get(f"/jobs/{job.pk}/").content.decode()
    assert 'data-testid="never-ran"' in page and 'data-testid="logs"' not in page
    assert job.failure_reason.split(";")[0] in page


def test_lists_say_which_model_a_job_without_one_landed_on(logged_in):
    logged_in.post("/jobs/new/", {**FORM, "name": "anywhere", "gpu_model": "", "gpus": "1"})
    job = Job.objects.get()
    listed = logged_in.get("/jobs/").content.decode()
    assert "1 × any" in listed and "(on " not in listed  # queued: holds no GPU yet
    run_cycle()
    model = job.allocations.get().gpu_model.name
    for page in ("/jobs/", "/"):
        assert f"(on {model})" in logged_in.get(page).content.decode(), page


def test_the_poll_that_sees_a_job_end_removes_the_cancel_button(logged_in):
    logged_in.post("/jobs/new/", FORM)
    job = Job.objects.get()
    page = logged_in.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="job-cancel"' in page and 'data-testid="cancel"' in page
    running = logged_in.get(f"/jobs/{job.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert "hx-swap-oob" not in running  # still cancellable: the button stays
    logged_in.post(f"/jobs/{job.pk}/cancel/")
    ended = logged_in.get(f"/jobs/{job.pk}/", HTTP_HX_REQUEST="true").content.decode()
    assert '<div id="job-cancel" hx-swap-oob="true"></div>' in ended
    assert 'data-testid="cancel"' not in logged_in.get(f"/jobs/{job.pk}/").content.decode()


def test_a_researcher_on_an_operator_page_gets_the_portals_403(logged_in):
    resp = logged_in.get("/ops/nodes/")
    assert resp.status_code == 403
    html = resp.content.decode()
    assert 'data-testid="forbidden"' in html and "Operators only." in html
    assert "Back to the dashboard" in html and "<nav" in html  # the portal's own page


def test_the_pools_page_names_pending_reasons_in_words(client, team, fleet, make_user):
    from django.test import override_settings

    client.force_login(team["member"])
    client.post("/jobs/new/", FORM)
    Job.objects.update(pending_reason="no_matching_gpu")  # as a cycle writes it
    client.force_login(make_user(staff=True))
    with override_settings(OTP_REQUIRED_FOR_STAFF=False):
        html = client.get("/ops/pools/").content.decode()
    assert "No matching GPU" in html and "no_matching_gpu" not in html
