"""Every API error has one shape: code, message, fields (and the older detail)."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db


def _shape(resp, code):
    body = resp.json()
    assert body["code"] == code, body
    assert body["message"] and body["detail"] == body["message"]
    assert isinstance(body["fields"], dict)
    return body


def test_framework_errors_have_the_shape(team, fleet, api):
    _shape(APIClient().get("/api/v1/jobs"), "not_authenticated")
    client = api(team["member"])
    body = _shape(client.get("/api/v1/jobs/999999"), "not_found")
    assert body["message"] == "Not found." and body["fields"] == {}
    _shape(client.put("/api/v1/jobs", {}, format="json"), "method_not_allowed")
    resp = client.generic("POST", "/api/v1/jobs", "{oops", content_type="application/json")
    _shape(resp, "parse_error")


def test_validation_errors_name_every_field(team, fleet, api):
    resp = api(team["member"]).post(
        "/api/v1/jobs", {"project": "alpha", "gpus": 0, "gpu_model": "H999"}, format="json"
    )
    assert resp.status_code == 400
    body = _shape(resp, "invalid")
    assert set(body["fields"]) == {"name", "command", "gpus", "gpu_model"}
    assert body["message"].startswith("name: This field is required. (and 3 more fields)")
    assert "Object with" not in str(body)
    assert body["gpu_model"] == body["fields"]["gpu_model"]  # the older top-level key


def test_an_unknown_field_named_like_the_envelope_stays_in_fields(make_user, api):
    resp = api(make_user()).post("/api/v1/tokens", {"name": "x", "code": 1}, format="json")
    body = _shape(resp, "invalid")
    assert body["fields"]["code"][0].startswith("Unknown field.")


def test_domain_errors_have_the_shape(team, fleet, api):
    client = api(team["member"])
    job = client.post(
        "/api/v1/jobs", {"project": "alpha", "name": "a", "command": "true"}, format="json"
    ).json()
    assert client.post(f"/api/v1/jobs/{job['id']}/cancel").status_code == 200
    resp = client.post(f"/api/v1/jobs/{job['id']}/cancel")
    assert resp.status_code in (400, 409)
    assert "cancel" in _shape(resp, resp.json()["code"])["message"].lower()
    resp = api(team["owner"]).post(
        "/api/v1/projects/alpha/members", {"email": "not-an-address"}, format="json"
    )
    body = _shape(resp, resp.json()["code"])
    assert list(body["fields"]) == ["email"]


def test_adding_a_member_answers_201_with_the_invitation(team, api):
    """Adding is an invitation (nobody joins without consent): the answer is the invitation,
    the same for an address with an account as without; the member exists once it is accepted."""
    client = api(team["owner"])
    resp = client.post(
        "/api/v1/projects/alpha/members", {"email": team["outsider"].email}, format="json"
    )
    assert resp.status_code == 201
    assert resp.json()["status"] == "pending" and resp.json()["email"] == team["outsider"].email
    members = client.get("/api/v1/projects/alpha/members").json()["results"]
    assert team["outsider"].email not in {m["email"] for m in members}
