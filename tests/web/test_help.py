"""The help page: the concepts, and API examples in curl, Python and the CLI, each of which is
run here, as the page shows it, against the live test server with a real token."""

from __future__ import annotations

import html
import os
import subprocess
import sys
from pathlib import Path

import pytest

from portal.services import token_create
from scheduler.core.reasons import PendingReason
from scheduler.models import Job
from web.help_examples import EXAMPLES

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.django_db
def test_page_shows_the_concepts_and_every_example_verbatim(client, team):
    client.force_login(team["member"])
    page = client.get("/help/").content.decode()
    for concept in ("quotas", "shares", "preemptible", "reservations", "pending"):
        assert f'data-testid="concept-{concept}"' in page
    for reason in PendingReason:
        assert reason.label in page
    for example in EXAMPLES:
        for _, text in example.variants:
            assert html.escape(text) in page, (example.key, text)


def _run(kind: str, text: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = (
        [sys.executable, "-c", text]
        if kind == "Python"
        else ["bash", "-euo", "pipefail", "-c", text]
    )
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.django_db(transaction=True)
def test_every_example_runs_against_the_live_server(live_server, team, fleet, ckpt_volume):
    token = token_create(user=team["member"], name="help examples").secret
    env = {
        **os.environ,
        "GPUCLOUD_URL": live_server.url,
        "GPUCLOUD_TOKEN": token,
        "GPUCLOUD_PROJECT": "alpha",
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",  # gpucloud, as installed
        "PYTHONPATH": str(REPO / "cli"),
        "GPUCLOUD_CONFIG": "/nonexistent/gpucloud.json",  # only the environment's login
    }
    ran = 0
    for example in EXAMPLES:
        for kind, text in example.variants:
            result = _run(kind, text, env)
            assert result.returncode == 0, (example.key, kind, result.stderr)
            assert example.expect.lower() in result.stdout.lower(), (
                example.key,
                kind,
                result.stdout,
            )
            ran += 1
    assert ran == 3 * len(EXAMPLES)
    # the three submit examples each created a job, as the member
    submitted = Job.objects.filter(name="train", project=team["a"])
    assert submitted.count() == 3 and {j.submitted_by for j in submitted} == {team["member"]}
