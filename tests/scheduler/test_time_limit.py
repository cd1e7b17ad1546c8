"""The job's wall-clock time limit: accepted, bounded and kept from the form and the API."""

from __future__ import annotations

import pytest

from scheduler.forms import JobForm
from scheduler.models import Job

pytestmark = pytest.mark.django_db


def post(api, user, **fields):
    body = {"project": "alpha", "name": "train", "command": "python train.py", **fields}
    return api(user).post("/api/v1/jobs", body, format="json")


def test_api_keeps_the_time_limit_and_shows_it(team, fleet, api):
    resp = post(api, team["member"], time_limit_s=7200, runtime_estimate_s=3600)
    assert resp.status_code == 201, resp.content
    assert resp.json()["time_limit_s"] == 7200
    assert Job.objects.get(pk=resp.json()["id"]).time_limit_s == 7200


@pytest.mark.parametrize(
    ("fields", "field", "words"),
    [
        ({"time_limit_s": 30}, "time_limit_s", "60"),
        ({"time_limit_s": 3600, "runtime_estimate_s": 7200}, "runtime_estimate_s", "time limit"),
    ],
)
def test_api_refuses_a_bad_time_limit_naming_the_field(team, fleet, api, fields, field, words):
    resp = post(api, team["member"], **fields)
    assert resp.status_code == 400
    assert field in resp.content.decode() and words in resp.content.decode()
    assert not Job.objects.exists()


def test_form_takes_the_time_limit_in_hours(team, fleet):
    projects = team["a"].__class__.objects.filter(pk=team["a"].pk)
    form = JobForm(
        {
            "project": "alpha",
            "name": "train",
            "command": "python train.py",
            "shape": "whole",
            "gpus": 1,
            "priority": 1,
            "time_limit_h": "1.5",
        },
        projects=projects,
    )
    assert form.is_valid(), form.errors
    assert form.spec is not None and form.spec.time_limit_s == 5400


def test_form_puts_the_limit_error_next_to_its_field(team, fleet):
    projects = team["a"].__class__.objects.filter(pk=team["a"].pk)
    form = JobForm(
        {
            "project": "alpha",
            "name": "train",
            "command": "python train.py",
            "shape": "whole",
            "gpus": 1,
            "priority": 1,
            "time_limit_h": "0.01",
        },
        projects=projects,
    )
    assert not form.is_valid()
    assert "time_limit_h" in form.errors
