"""Self-service accounts: projects, invitations, sign-up, password reset, e-mail change, audit.

E-mails go to Django's locmem outbox; they are sent when the deciding transaction commits, so
requests that send one run inside `django_capture_on_commit_callbacks(execute=True)`.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.messages import get_messages
from django.core import mail
from django.test import Client
from django.utils import timezone

from portal.models import AuditEvent, Invitation, Membership, Project, Role, User

pytestmark = pytest.mark.django_db


@pytest.fixture
def sent(django_capture_on_commit_callbacks):
    """Run a block with its after-commit e-mails delivered to the outbox."""
    return lambda: django_capture_on_commit_callbacks(execute=True)


def link_in(message, fragment: str) -> str:
    """The path of the first link in an e-mail containing `fragment`."""
    url = next(w for w in message.body.split() if fragment in w)
    return re.sub(r"^https?://[^/]+", "", url)


def signed_in(user: User) -> Client:
    client = Client()
    client.force_login(user)
    return client


def invite(owner: User, email: str, sent, role: str = "member", slug: str = "alpha"):
    client = signed_in(owner)
    with sent():
        resp = client.post(f"/projects/{slug}/members/add/", {"email": email, "role": role})
    return resp, client


# ---- projects --------------------------------------------------------------------------------


def test_create_a_project_from_the_page_makes_you_owner(make_user):
    user = make_user()
    client = signed_in(user)
    assert client.get("/projects/new/").status_code == 200
    resp = client.post("/projects/new/", {"name": "Vision", "slug": "vision"})
    assert resp.status_code == 302 and resp["Location"] == "/projects/vision/"
    project = Project.objects.get(slug="vision")
    assert Membership.objects.get(project=project, user=user).role == Role.OWNER
    assert AuditEvent.objects.filter(project=project, action="project.create").exists()
    assert project.quota is not None  # the scheduler gives every new project its quota row


@pytest.mark.parametrize(
    ("slug", "error"),
    [
        ("Bad Slug", "lowercase"),
        ("-edge", "lowercase"),
        ("new", "reserved"),
        ("alpha", "already exists"),
    ],
)
def test_project_slug_rules_give_form_errors(team, slug, error):
    client = signed_in(team["member"])
    before = Project.objects.count()
    resp = client.post("/projects/new/", {"name": "X", "slug": slug})
    assert resp.status_code == 200 and error in resp.content.decode()
    assert Project.objects.count() == before


# ---- invitations -----------------------------------------------------------------------------


def test_inviting_a_known_and_an_unknown_address_answer_identically(team, sent):
    known, _ = invite(team["owner"], team["outsider"].email, sent)
    unknown, _ = invite(team["owner"], "nobody-yet@example.org", sent)
    assert known.status_code == unknown.status_code == 302
    assert known["Location"] == unknown["Location"]
    page = signed_in(team["owner"])
    texts = [
        [str(m).replace(address, "ADDR") for m in get_messages(resp.wsgi_request)]
        for resp, address in ((known, team["outsider"].email), (unknown, "nobody-yet@example.org"))
    ]
    assert texts[0] == texts[1] and "Invitation sent to ADDR" in texts[0][0]
    # Both got an invitation, nobody joined; the e-mails have the same text bar the link.
    assert len(mail.outbox) == 2
    bodies = [re.sub(r"invitations/\S+", "LINK", m.body) for m in mail.outbox]
    assert bodies[0] == bodies[1]
    assert not Membership.objects.filter(project=team["a"], user=team["outsider"]).exists()
    html = page.get("/projects/alpha/").content.decode()
    assert team["outsider"].email in html and "nobody-yet@example.org" in html  # pending list


def test_the_api_answers_identically_for_known_and_unknown(team, api, sent):
    client = api(team["owner"])
    with sent():
        a = client.post("/api/v1/projects/alpha/members/", {"email": team["outsider"].email})
        b = client.post("/api/v1/projects/alpha/members/", {"email": "ghost@example.org"})
    assert a.status_code == b.status_code == 201
    assert set(a.json()) == set(b.json()) and a.json()["status"] == b.json()["status"] == "pending"
    assert not Membership.objects.filter(project=team["a"], user=team["outsider"]).exists()


def test_invitation_is_accepted_by_its_recipient_only(team, make_user, sent):
    invitee = make_user("invitee@example.org")
    invite(team["owner"], "Invitee@Example.org", sent, role="viewer")
    path = link_in(mail.outbox[-1], "/invitations/")
    token = path.rstrip("/").rsplit("/", 1)[1]
    assert Invitation.objects.filter(token_hash__contains=token).count() == 0  # only a hash kept

    # Another account, even an owner of another project, cannot take it.
    thief = signed_in(team["outsider"])
    resp = thief.get(path)
    assert "another address" in resp.content.decode()
    resp = thief.post(path)
    assert resp.status_code == 400
    assert not Membership.objects.filter(project=team["a"], user=team["outsider"]).exists()
    # Anonymous sign-up through it cannot create a second account for an existing address.
    resp = Client().post(path, {"password1": "Long-enough-pw-1", "password2": "Long-enough-pw-1"})
    assert resp.status_code == 400 and "sign in" in resp.content.decode()
    assert User.objects.filter(email__iexact="invitee@example.org").count() == 1

    resp = signed_in(invitee).post(path)
    assert resp.status_code == 302 and resp["Location"] == "/projects/alpha/"
    assert Membership.objects.get(project=team["a"], user=invitee).role == Role.VIEWER
    # Single use.
    assert signed_in(invitee).post(path).status_code == 400
    actions = set(AuditEvent.objects.filter(project=team["a"]).values_list("action", flat=True))
    assert {"invitation.create", "invitation.accept", "membership.add"} <= actions


def test_sign_up_through_an_invitation(team, sent):
    invite(team["owner"], "newbie@example.org", sent)
    path = link_in(mail.outbox[-1], "/invitations/")
    client = Client()
    assert "Create account and join" in client.get(path).content.decode()
    resp = client.post(path, {"full_name": "New Bie", "password1": "x", "password2": "x"})
    assert resp.status_code == 200 and not User.objects.filter(email="newbie@example.org").exists()
    resp = client.post(
        path,
        {"full_name": "New Bie", "password1": "Long-enough-pw-1", "password2": "Long-enough-pw-1"},
    )
    assert resp.status_code == 302
    user = User.objects.get(email="newbie@example.org")
    assert Membership.objects.get(project=team["a"], user=user).role == Role.MEMBER
    assert client.get("/projects/alpha/").status_code == 200  # signed in


def test_owner_revokes_a_pending_invitation(team, make_user, sent):
    invitee = make_user("late@example.org")
    _, owner = invite(team["owner"], invitee.email, sent)
    path = link_in(mail.outbox[-1], "/invitations/")
    invitation = Invitation.objects.get(email="late@example.org")
    # A member may not revoke; another tenant's owner sees no such project.
    assert (
        signed_in(team["member"])
        .post(f"/projects/alpha/invitations/{invitation.pk}/revoke/")
        .status_code
        == 302
    )
    assert (
        signed_in(team["outsider"])
        .post(f"/projects/alpha/invitations/{invitation.pk}/revoke/")
        .status_code
        == 404
    )
    invitation.refresh_from_db()
    assert invitation.is_pending
    owner.post(f"/projects/alpha/invitations/{invitation.pk}/revoke/")
    invitation.refresh_from_db()
    assert invitation.status == "revoked"
    assert signed_in(invitee).post(path).status_code == 400
    assert not Membership.objects.filter(project=team["a"], user=invitee).exists()


def test_expired_invitation_cannot_be_accepted(team, make_user, sent):
    invitee = make_user("slow@example.org")
    invite(team["owner"], invitee.email, sent)
    path = link_in(mail.outbox[-1], "/invitations/")
    Invitation.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    resp = signed_in(invitee).post(path)
    assert resp.status_code == 400 and "expired" in resp.content.decode()
    assert not Membership.objects.filter(project=team["a"], user=invitee).exists()


def test_a_made_up_invitation_link_is_404(client):
    assert client.get("/invitations/not-a-real-token/").status_code == 404


def test_reinviting_replaces_the_old_link(team, make_user, sent):
    invitee = make_user("twice@example.org")
    invite(team["owner"], invitee.email, sent)
    first = link_in(mail.outbox[-1], "/invitations/")
    invite(team["owner"], invitee.email, sent, role="viewer")
    second = link_in(mail.outbox[-1], "/invitations/")
    assert signed_in(invitee).post(first).status_code == 400
    assert signed_in(invitee).post(second).status_code == 302
    assert Membership.objects.get(project=team["a"], user=invitee).role == Role.VIEWER


# ---- open sign-up ----------------------------------------------------------------------------


def test_open_sign_up_is_off_unless_an_operator_turns_it_on(client):
    assert client.get("/signup/").status_code == 404
    assert "Create an account" not in client.get("/login/").content.decode()


def test_open_sign_up_verifies_the_address(client, settings, make_user, sent):
    settings.SIGNUP_OPEN = True
    make_user("taken@example.org")
    with sent():
        new = client.post("/signup/", {"email": "fresh@example.org"})
        taken = client.post("/signup/", {"email": "taken@example.org"})
    # Same page either way; the owner of the taken address gets a note, not a link.
    assert new.status_code == taken.status_code == 200

    def main(resp, word: str) -> str:
        html = resp.content.decode().replace(word, "X")
        return html[html.index("<main") :]

    assert main(new, "fresh") == main(taken, "taken")
    to = {m.to[0]: m for m in mail.outbox}
    assert "/signup/" not in to["taken@example.org"].body
    path = link_in(to["fresh@example.org"], "/signup/")
    assert "fresh@example.org" in client.get(path).content.decode()
    resp = client.post(path, {"password1": "Long-enough-pw-1", "password2": "Long-enough-pw-1"})
    assert resp.status_code == 302 and resp["Location"] == "/projects/new/"
    assert User.objects.filter(email="fresh@example.org").exists()
    # A tampered link is not valid.
    assert client.get(path[:-3] + "xx/").status_code == 404


# ---- password reset --------------------------------------------------------------------------


def test_password_reset_by_email(client, make_user, sent):
    user = make_user("forgetful@example.org")
    with sent():
        known = client.post("/password/reset/", {"email": user.email})
        unknown = client.post("/password/reset/", {"email": "nobody@example.org"})
    assert known.status_code == unknown.status_code == 302
    assert known["Location"] == unknown["Location"] == "/password/reset/sent/"
    assert [m.to for m in mail.outbox] == [[user.email]]
    path = link_in(mail.outbox[0], "/password/reset/")
    resp = client.get(path, follow=True)
    assert "Choose a new password" in resp.content.decode()
    resp = client.post(
        resp.redirect_chain[-1][0],
        {"new_password1": "Brand-new-pw-77", "new_password2": "Brand-new-pw-77"},
    )
    assert resp.status_code == 302
    user.refresh_from_db()
    assert user.check_password("Brand-new-pw-77")
    # The link works once.
    assert "not valid" in client.get(path, follow=True).content.decode()


def test_password_reset_is_throttled(client, settings, make_user, sent):
    settings.ACCOUNT_EMAIL_RATE = "2/hour"
    user = make_user()
    throttled = Client(REMOTE_ADDR="198.51.100.7")
    with sent():
        for _ in range(3):
            resp = throttled.post("/password/reset/", {"email": user.email})
    assert resp.status_code == 200 and "Too many requests" in resp.content.decode()
    assert len(mail.outbox) <= 2


# ---- e-mail change ---------------------------------------------------------------------------


def test_email_change_is_confirmed_from_the_new_address(make_user, sent):
    user = make_user("old@example.org")
    client = signed_in(user)
    resp = client.post("/account/", {"new_email": "new@example.org", "password": "wrong"})
    assert "not right" in resp.content.decode() and not mail.outbox
    with sent():
        client.post("/account/", {"new_email": "new@example.org", "password": "pw-123456"})
    user.refresh_from_db()
    assert user.email == "old@example.org"  # nothing changes before confirmation
    assert mail.outbox[-1].to == ["new@example.org"]
    path = link_in(mail.outbox[-1], "/account/email/")
    # Another account cannot use the link.
    other = signed_in(make_user())
    other.post(path)
    user.refresh_from_db()
    assert user.email == "old@example.org"
    with sent():
        client.post(path)
    user.refresh_from_db()
    assert user.email == "new@example.org"
    assert mail.outbox[-1].to == ["old@example.org"]  # the old address is told
    assert AuditEvent.objects.filter(action="user.email_change", actor=user).exists()


# ---- audit log -------------------------------------------------------------------------------


def test_owners_see_their_projects_audit_events_only(team, sent):
    invite(team["owner"], "someone@example.org", sent)
    invite(team["outsider"], "beta-secret@example.org", sent, slug="beta")
    owner = signed_in(team["owner"])
    html = owner.get("/projects/alpha/audit/").content.decode()
    assert "invitation.create" in html and "someone@example.org" in html
    assert "beta-secret@example.org" not in html
    assert signed_in(team["member"]).get("/projects/alpha/audit/").status_code == 403
    assert signed_in(team["viewer"]).get("/projects/alpha/audit/").status_code == 403
    assert signed_in(team["outsider"]).get("/projects/alpha/audit/").status_code == 404


def test_audit_log_is_paginated(team):
    from portal.audit import audit_record

    for i in range(120):
        audit_record(actor=team["owner"], action=f"test.event{i:03d}", project=team["a"])
    owner = signed_in(team["owner"])
    first = owner.get("/projects/alpha/audit/").content.decode()
    assert "test.event119" in first and "test.event000" not in first
    last = owner.get("/projects/alpha/audit/?page=3").content.decode()
    assert "test.event000" in last and "Page 3 of 3" in last
    assert owner.get("/projects/alpha/audit/?page=zzz").status_code == 200
