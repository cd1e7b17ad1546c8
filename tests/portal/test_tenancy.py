"""Tenancy isolation through pages and the API: other projects are invisible, roles are enforced."""

from __future__ import annotations

import hashlib

import pytest
from django.test import Client

from portal.models import AuditEvent, Membership, Role

pytestmark = pytest.mark.django_db


def login(client: Client, user) -> Client:
    client.force_login(user)
    return client


def test_member_of_a_cannot_see_b_in_list_or_detail(team, api):
    client = api(team["member"])
    slugs = [p["slug"] for p in client.get("/api/v1/projects/").json()["results"]]
    assert slugs == ["alpha"]
    assert client.get("/api/v1/projects/beta/").status_code == 404
    assert client.get("/api/v1/projects/beta/members/").status_code == 404


def test_member_of_a_cannot_change_b(team, api):
    client = api(team["owner"])  # owner of A, stranger to B
    resp = client.post(
        "/api/v1/projects/beta/members/", {"email": team["owner"].email}, format="json"
    )
    assert resp.status_code == 404
    assert not Membership.objects.filter(project=team["b"], user=team["owner"]).exists()


def test_project_page_of_another_tenant_is_404(team, client):
    login(client, team["member"])
    assert client.get("/projects/alpha/").status_code == 200
    assert client.get("/projects/beta/").status_code == 404
    resp = client.post(
        "/projects/beta/members/add/", {"email": team["member"].email, "role": "owner"}
    )
    assert resp.status_code == 404
    assert not Membership.objects.filter(project=team["b"], user=team["member"]).exists()


def test_viewer_cannot_change_anything(team, api):
    client = api(team["viewer"])
    resp = client.post(
        "/api/v1/projects/alpha/members/", {"email": team["outsider"].email}, format="json"
    )
    assert resp.status_code == 403
    assert "viewer" in resp.json()["detail"]
    m = Membership.objects.get(project=team["a"], user=team["member"])
    assert (
        client.patch(
            f"/api/v1/projects/alpha/members/{m.pk}/", {"role": "owner"}, format="json"
        ).status_code
        == 403
    )
    assert client.delete(f"/api/v1/projects/alpha/members/{m.pk}/").status_code == 403
    m.refresh_from_db()
    assert m.role == Role.MEMBER


def test_member_cannot_manage_members(team, api):
    resp = api(team["member"]).post(
        "/api/v1/projects/alpha/members/", {"email": team["outsider"].email}, format="json"
    )
    assert resp.status_code == 403


def test_owner_adds_changes_and_removes_members_with_audit(team, api):
    client = api(team["owner"])
    resp = client.post(
        "/api/v1/projects/alpha/members/",
        {"email": team["outsider"].email, "role": "viewer"},
        format="json",
    )
    assert resp.status_code == 201, resp.content
    assert resp.json()["status"] == "pending"  # an invitation: nobody joins without consent
    assert not Membership.objects.filter(project=team["a"], user=team["outsider"]).exists()
    from portal.accounts import invitation_accept
    from portal.models import Invitation

    invitation = Invitation.objects.get(pk=resp.json()["id"])
    token = "known-token-for-the-test"
    Invitation.objects.filter(pk=invitation.pk).update(
        token_hash=hashlib.sha256(token.encode()).hexdigest()
    )
    mid = invitation_accept(user=team["outsider"], token=token).pk
    assert (
        client.patch(
            f"/api/v1/projects/alpha/members/{mid}/", {"role": "member"}, format="json"
        ).json()["role"]
        == "member"
    )
    assert client.delete(f"/api/v1/projects/alpha/members/{mid}/").status_code == 204
    actions = list(
        AuditEvent.objects.filter(project=team["a"])
        .order_by("created_at")
        .values_list("action", flat=True)
    )
    assert actions[-5:] == [
        "invitation.create",
        "invitation.accept",
        "membership.add",
        "membership.role_change",
        "membership.remove",
    ]


def test_removed_member_loses_access_at_once(team, api, client):
    login(client, team["member"])
    assert client.get("/projects/alpha/").status_code == 200
    m = Membership.objects.get(project=team["a"], user=team["member"])
    assert api(team["owner"]).delete(f"/api/v1/projects/alpha/members/{m.pk}/").status_code == 204
    assert client.get("/projects/alpha/").status_code == 404
    assert api(team["member"]).get("/api/v1/projects/alpha/").status_code == 404


def test_last_owner_cannot_be_removed_or_demoted(team, api):
    m = Membership.objects.get(project=team["a"], user=team["owner"])
    client = api(team["owner"])
    resp = client.delete(f"/api/v1/projects/alpha/members/{m.pk}/")
    assert resp.status_code == 409
    assert "last owner" in resp.json()["detail"]
    assert (
        client.patch(
            f"/api/v1/projects/alpha/members/{m.pk}/", {"role": "viewer"}, format="json"
        ).status_code
        == 409
    )


def test_owner_manages_members_through_the_page(team, client, django_capture_on_commit_callbacks):
    """Adding is an invitation: nobody joins until they accept it; then roles and removal."""
    from django.core import mail

    login(client, team["owner"])
    with django_capture_on_commit_callbacks(execute=True):
        resp = client.post(
            "/projects/alpha/members/add/",
            {"email": team["outsider"].email, "role": "viewer"},
            follow=True,
        )
    assert resp.status_code == 200 and "Invitation sent" in resp.content.decode()
    assert not Membership.objects.filter(project=team["a"], user=team["outsider"]).exists()
    link = next(w for w in mail.outbox[-1].body.split() if "/invitations/" in w)
    invitee = Client()
    invitee.force_login(team["outsider"])
    invitee.post(link.split("testserver", 1)[1])
    m = Membership.objects.get(project=team["a"], user=team["outsider"])
    assert m.role == Role.VIEWER
    client.post(f"/projects/alpha/members/{m.pk}/role/", {"role": "member"})
    m.refresh_from_db()
    assert m.role == Role.MEMBER
    client.post(f"/projects/alpha/members/{m.pk}/remove/")
    assert not Membership.objects.filter(pk=m.pk).exists()


def test_viewer_page_form_post_is_refused(team, client):
    login(client, team["viewer"])
    resp = client.post(
        "/projects/alpha/members/add/",
        {"email": team["outsider"].email, "role": "owner"},
        follow=True,
    )
    assert "needs owner" in resp.content.decode()
    assert not Membership.objects.filter(project=team["a"], user=team["outsider"]).exists()


def test_anonymous_is_sent_to_login_and_api_refuses(client, api, team):
    resp = client.get("/projects/alpha/")
    assert resp.status_code == 302 and resp["Location"].startswith("/login/")
    assert api(None).get("/api/v1/projects/").status_code == 401


def test_project_page_shows_quotas_and_members(team, client):
    quota = team["a"].quota
    quota.max_gpus = 16
    quota.save()
    login(client, team["member"])
    html = client.get("/projects/alpha/").content.decode()
    assert "Concurrent GPUs" in html and "0 / 16 GPUs" in html
    assert team["viewer"].email in html
