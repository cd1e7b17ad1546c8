"""Env values marked secret are write-only: masked for everyone (staff and admin included) in
every page and API answer, and sent only to the node that runs the job.

The crawl walks every GET of the URL conf (the authorization matrix's routes and fillers) as
a researcher of the project (viewer, member, owner) and as an operator, plus the admin's job
pages as a superuser, and looks for the secret in every answer."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from rest_framework.test import APIClient

from portal.models import AuditEvent
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Job, JobEvent
from tests.hardening.test_authz_matrix import RULES, client_for, project_routes, url_for

pytestmark = pytest.mark.django_db

SECRET = "s3cr3t-value-7f1c9e"
FORM_SECRET = "f0rm-s3cr3t-52aa"
MATRIX_SECRET = "m4trix-s3cr3t-e0d1"
ALL = (SECRET, FORM_SECRET, MATRIX_SECRET)


def _body(response) -> bytes:
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content)
    return response.content


def test_a_secret_env_value_never_appears_in_any_page_or_api_answer(
    world, fleet, make_user, django_capture_on_commit_callbacks
):
    # written through the API (the answer masks it) and through the form
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {world['tokens']['member']}")
    resp = api.post(
        "/api/v1/jobs",
        {
            "project": "alpha",
            "name": "with-secret",
            "command": "true",
            "env": {"PLAIN": "visible"},
            "secret_env": {"WANDB_API_KEY": SECRET},
        },
        format="json",
    )
    assert resp.status_code == 201 and SECRET.encode() not in resp.content
    job = Job.objects.get(pk=resp.json()["id"])
    assert job.secret_env == {"WANDB_API_KEY": SECRET} and job.env == {"PLAIN": "visible"}
    page = Client()
    page.force_login(world["member"])
    form = {
        "project": "alpha",
        "name": "form-secret",
        "command": "true",
        "shape": "whole",
        "gpus": "1",
        "priority": "1",
        "secret_env": f"HF_TOKEN={FORM_SECRET}",
    }
    assert page.post("/jobs/new/", form).status_code == 302
    assert Job.objects.get(name="form-secret").secret_env == {"HF_TOKEN": FORM_SECRET}
    # a form shown again with an error does not echo the secret
    again = page.post("/jobs/new/", {**form, "command": ""})
    assert again.status_code in (200, 400) and FORM_SECRET.encode() not in again.content

    # the matrix's job (every job URL names it) carries a secret too, and is placed
    Job.objects.filter(pk=world["job"].pk).update(secret_env={"API_KEY": MATRIX_SECRET})
    with django_capture_on_commit_callbacks(execute=True):
        run_cycle()
    held = Allocation.objects.filter(job=world["job"]).first()
    assert held is not None
    # sent to the node that runs it, and to no other
    for name, token in fleet["tokens"].items():
        agent = APIClient()
        agent.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        answer = agent.post("/api/agent/v1/sync", {}, format="json")
        assert answer.status_code == 200
        assert (MATRIX_SECRET.encode() in answer.content) == (name == held.node.name), name

    detail = api.get(f"/api/v1/jobs/{world['job'].pk}").json()
    assert detail["secret_env"] == {"API_KEY": "********"}

    seen = 0
    for role in ("viewer", "member", "owner", "staff"):
        for route in project_routes():
            rule = RULES.get(route.name or "")
            if rule is None or "get" not in rule.methods or route.name == "logout":
                continue
            if route.path.startswith("api/agent/"):
                continue  # the agents' API: the node's own assignments, checked above
            url = url_for(route, rule, world)
            client = client_for(role, world, is_api=url.startswith("/api/"))
            body = _body(client.get(url))
            assert not [s for s in ALL if s.encode() in body], (role, url)
            seen += 1
    assert seen > 100  # the crawl reached the portal's pages and endpoints

    admin = make_user(staff=True)
    admin.is_superuser = True
    admin.save()
    site = Client()
    site.force_login(admin)
    for url in (
        "/admin/scheduler/job/",
        f"/admin/scheduler/job/{world['job'].pk}/change/",
        f"/admin/scheduler/job/{job.pk}/change/",
        "/admin/portal/auditevent/",
    ):
        resp = site.get(url)
        assert resp.status_code == 200, url
        assert not [s for s in ALL if s.encode() in resp.content], url
    assert (
        b"API_KEY=********" in site.get(f"/admin/scheduler/job/{world['job'].pk}/change/").content
    )

    # nor in what the portal records
    recorded = json.dumps(
        [
            *AuditEvent.objects.values_list("data", flat=True),
            *JobEvent.objects.values_list("data", "reason"),
        ]
    )
    assert not [s for s in ALL if s in recorded]
