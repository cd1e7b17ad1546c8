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


# -- an array's page ------------------------------------------------------------------------------

BY_STATE_SAYS = "s => document.querySelector('[data-testid=array-by-state]').innerText.includes(s)"
SHARD_LOG_SAYS = "s => document.querySelector('[data-testid=shard-log]').innerText.includes(s)"


def _array(team, fleet) -> tuple[list, object]:
    """A 2-shard array, placed: its shards, and the node of the last one."""
    from scheduler.admission import JobSpec, job_submit
    from scheduler.cycle import run_cycle
    from scheduler.models import GpuModel

    shards = job_submit(
        actor=team["member"],
        project=team["a"],
        spec=JobSpec(
            name="farm",
            command="true",
            gpu_model=GpuModel.objects.get(name="H100-80GB-SXM"),
            shard_count=2,
        ),
    )
    run_cycle()
    return shards, Allocation.objects.get(job=shards[-1]).node


def test_an_array_page_is_pushed_its_shards_and_a_shards_log(browser, asgi_server, team, fleet):
    shards, node = _array(team, fleet)
    context = browser.new_context(base_url=asgi_server)
    page = context.new_page()
    page.set_default_timeout(15_000)
    causes = []
    page.on("request", lambda r: causes.append(r.headers.get("x-refresh-cause")))
    _login(page, team["member"])
    page.goto(f"/jobs/{shards[0].pk}/array/")
    page.wait_for_selector("html[data-push=open]")
    page.click(f"[data-testid=shard-log-{shards[-1].shard_index}]")  # the last shard's log
    page.wait_for_function("() => gpPushStats().skipped >= 2")  # polls skipped: push is live

    _start_and_log(shards[-1], node)  # it starts, and prints a line
    page.wait_for_function(BY_STATE_SAYS, arg="running 1")
    page.wait_for_function(SHARD_LOG_SAYS, arg="epoch 1 done")
    assert "poll" not in causes and "push" in causes
    context.close()


def test_without_push_the_array_page_polls_and_still_follows_its_shards(page, team, fleet):
    shards, node = _array(team, fleet)
    polls = []
    page.on(
        "request",
        lambda r: polls.append(r.url) if r.headers.get("x-refresh-cause") == "poll" else None,
    )
    _login(page, team["member"])
    page.goto(f"/jobs/{shards[0].pk}/array/")
    page.wait_for_selector("html[data-push=failed]")  # the WSGI live server cannot stream
    _start_and_log(shards[-1], node)
    page.wait_for_function(BY_STATE_SAYS, arg="running 1")
    assert any(url.endswith(f"/jobs/{shards[0].pk}/array/") for url in polls)
