"""Bad input gets a 400 that says what to fix, never a 500."""

from __future__ import annotations

import pytest

from portal.models import ApiToken, Membership

pytestmark = pytest.mark.django_db


def test_malformed_json_is_400(make_user, api):
    client = api(make_user())
    resp = client.generic("POST", "/api/v1/tokens/", "{not json", content_type="application/json")
    assert resp.status_code == 400
    assert "JSON parse error" in resp.json()["detail"]


def test_non_object_body_is_400(make_user, api):
    resp = api(make_user()).post("/api/v1/tokens/", ["a"], format="json")
    assert resp.status_code == 400
    assert "JSON object" in str(resp.json())


def test_unknown_field_is_named(make_user, api):
    resp = api(make_user()).post("/api/v1/tokens/", {"name": "x", "nmae": "y"}, format="json")
    assert resp.status_code == 400
    assert "nmae" in resp.json()
    assert "Unknown field" in resp.json()["nmae"][0]
    assert ApiToken.objects.count() == 0


def test_over_long_name_is_400(make_user, api):
    resp = api(make_user()).post("/api/v1/tokens/", {"name": "x" * 101}, format="json")
    assert resp.status_code == 400
    assert "100 characters" in resp.json()["name"][0]


def test_blank_token_name_is_400(make_user, api):
    resp = api(make_user()).post("/api/v1/tokens/", {"name": "   "}, format="json")
    assert resp.status_code == 400
    assert "name" in resp.json()


def test_member_add_bad_email_and_role(team, api):
    client = api(team["owner"])
    resp = client.post(
        "/api/v1/projects/alpha/members/", {"email": "nobody@example.org"}, format="json"
    )
    assert resp.status_code == 201 and resp.json()["status"] == "pending"  # an invitation
    resp = client.post(
        "/api/v1/projects/alpha/members/",
        {"email": team["outsider"].email, "role": "god"},
        format="json",
    )
    assert resp.status_code == 400 and "role" in resp.json()
    resp = client.post("/api/v1/projects/alpha/members/", {"email": "not-an-email"}, format="json")
    assert resp.status_code == 400 and "email" in resp.json()
    assert not Membership.objects.filter(project=team["a"], user=team["outsider"]).exists()


def test_adding_existing_member_is_409(team, api):
    resp = api(team["owner"]).post(
        "/api/v1/projects/alpha/members/", {"email": team["member"].email}, format="json"
    )
    assert resp.status_code == 409
    assert "already a member" in resp.json()["detail"]


def test_non_numeric_ids_are_404_not_500(team, api):
    client = api(team["owner"])
    assert client.delete("/api/v1/projects/alpha/members/abc/").status_code == 404
    assert client.delete("/api/v1/tokens/abc/").status_code == 404
    assert client.get("/api/v1/projects/NOT%20A%20SLUG/").status_code == 404
