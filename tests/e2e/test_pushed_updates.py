"""Pushed page updates in a real browser: under the ASGI server a job page hears its job's
change and its new log lines by server-sent events, with no polling request; under a WSGI
server (no stream) the same page falls back to polling and still sees them."""

from __future__ import annotations

import re

import pytest

from scheduler.models import Allocation, JobState
from scheduler.nodes.reports import job_log_append
from scheduler.transitions import job_transition
from tests.scheduler.conftest import placed  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

STATUS_SAYS = "s => document.querySelector('[data-testid=job-status]').innerText.includes(s)"
LOGS_SAY = "s => document.querySelector('[data-testid=logs]').innerText.includes(s)"


def _login(page, user) -> None:
    page.goto("/login/")
    page.fill("#id_username", user.email)
    page.fill("#id_password", "pw-123456")
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/$"))


def _start_and_log(job, node) -> None:
    job_transition(job=job, to=JobState.RUNNING, reason="Started on the node")
    attempt = Allocation.objects.filter(job=job).values_list("attempt", flat=True).first()
    job_log_append(
        node=node, job_id=job.pk, attempt=attempt, seq=1, stream="stdout", text="epoch 1 done\n"
    )


def test_a_job_page_is_pushed_its_status_and_logs_without_polling(browser, asgi_server, placed):  # noqa: F811
    job, node = placed["job"], placed["node"]
    context = browser.new_context(base_url=asgi_server)
    page = context.new_page()
    page.set_default_timeout(15_000)
    asked = []  # every htmx request of the page, with what caused it (push.js tags them)
    page.on("requestfinished", lambda r: asked.append(r))
    _login(page, job.submitted_by)
    page.goto(f"/jobs/{job.pk}/")
    page.wait_for_selector("html[data-push=open]")
    assert page.evaluate(STATUS_SAYS, "scheduled")
    # a poll interval has passed with push live: each part's poll was skipped, not made
    page.wait_for_function("() => gpPushStats().skipped >= 3")

    _start_and_log(job, node)
    page.wait_for_function(STATUS_SAYS, arg="running")
    page.wait_for_function(LOGS_SAY, arg="epoch 1 done")

    refreshes = [r for r in asked if "x-refresh-cause" in r.headers]
    assert not [r.url for r in refreshes if r.headers["x-refresh-cause"] == "poll"]
    status = [r.headers["x-refresh-cause"] for r in refreshes if r.url.endswith(f"/jobs/{job.pk}/")]
    assert status and set(status) == {"push"}, status  # every refresh was told to
    with_text = [r for r in refreshes if "/logs/" in r.url and "epoch 1" in r.response().text()]
    assert [r.headers["x-refresh-cause"] for r in with_text] == ["push"]
    context.close()


def test_without_push_the_job_page_polls_and_still_follows_the_job(page, placed):  # noqa: F811
    job, node = placed["job"], placed["node"]
    polls = []
    page.on(
        "request",
        lambda r: polls.append(r.url) if r.headers.get("x-refresh-cause") == "poll" else None,
    )
    _login(page, job.submitted_by)
    page.goto(f"/jobs/{job.pk}/")
    # the WSGI live server cannot stream: the stream answers 204 and the page polls
    page.wait_for_selector("html[data-push=failed]")
    _start_and_log(job, node)
    page.wait_for_function(STATUS_SAYS, arg="running")
    page.wait_for_function(LOGS_SAY, arg="epoch 1 done")
    assert any(url.endswith(f"/jobs/{job.pk}/") for url in polls)
