"""TOTP second factor (django-otp): required for operators, optional for everyone else."""

from __future__ import annotations

import pytest
from django.test import Client
from django_otp.oath import totp
from django_otp.plugins.otp_totp.models import TOTPDevice

from portal.models import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _required(settings):
    settings.OTP_REQUIRED_FOR_STAFF = True


def code_for(device: TOTPDevice, *, offset: int = 0) -> str:
    return f"{totp(device.bin_key, step=device.step, t0=device.t0, digits=device.digits, drift=device.drift + offset):06d}"


def test_staff_without_a_device_is_sent_to_set_one_up(make_user):
    operator = make_user("op@example.org", staff=True)
    client = Client()
    client.force_login(operator)
    for path in ("/ops/nodes/", "/ops/requests/", "/", "/admin/"):
        resp = client.get(path)
        assert resp.status_code == 302, path
        assert resp["Location"].startswith("/account/two-factor/?next="), path
    assert client.get("/api/v1/projects/").status_code == 403  # a session on the API, too

    page = client.get("/account/two-factor/")
    html = page.content.decode()
    assert page.status_code == 200 and 'data-testid="totp-qr"' in html
    assert "data:image/svg+xml" in html and page["Cache-Control"] == "no-store"
    device = TOTPDevice.objects.get(user=operator, confirmed=False)
    assert client.post("/account/two-factor/", {"token": "000000"}).status_code == 400
    resp = client.post("/account/two-factor/", {"token": code_for(device), "next": "/ops/nodes/"})
    assert resp.status_code == 302 and resp["Location"] == "/ops/nodes/"
    assert client.get("/ops/nodes/").status_code == 200
    assert AuditEvent.objects.filter(actor=operator, action="user.totp.enable").exists()


def test_staff_with_a_device_enters_a_code_after_the_password(make_user):
    operator = make_user("op2@example.org", staff=True)
    device = TOTPDevice.objects.create(user=operator, name="phone", confirmed=True)
    client = Client()
    assert (
        client.post("/login/", {"username": operator.email, "password": "pw-123456"}).status_code
        == 302
    )
    resp = client.get("/ops/nodes/")
    assert resp["Location"].startswith("/account/two-factor/verify/?next=")
    assert client.post("/account/two-factor/verify/", {"token": "123"}).status_code == 400
    assert client.get("/ops/nodes/").status_code == 302  # still not verified
    resp = client.post(
        "/account/two-factor/verify/", {"token": code_for(device), "next": "https://evil.example/"}
    )
    assert resp.status_code == 302 and resp["Location"] == "/"  # no open redirect
    assert client.get("/ops/nodes/").status_code == 200
    # The same code cannot be replayed in another session.
    other = Client()
    other.force_login(operator)
    assert other.post("/account/two-factor/verify/", {"token": code_for(device)}).status_code == 400


def test_researchers_are_not_asked_but_may_turn_it_on(make_user):
    user = make_user()
    client = Client()
    client.force_login(user)
    assert client.get("/").status_code == 200
    client.get("/account/two-factor/")
    device = TOTPDevice.objects.get(user=user)
    client.post("/account/two-factor/", {"token": code_for(device)})
    device.refresh_from_db()
    assert device.confirmed
    # A code is used once: removing takes the next step's code (within the drift tolerance).
    assert client.post("/account/two-factor/", {"token": code_for(device)}).status_code == 400
    resp = client.post("/account/two-factor/", {"token": code_for(device, offset=1)})
    assert resp.status_code == 302
    assert not TOTPDevice.objects.filter(user=user).exists()
    assert AuditEvent.objects.filter(actor=user, action="user.totp.remove").exists()


def test_operators_cannot_remove_their_second_factor(make_user):
    operator = make_user("op3@example.org", staff=True)
    device = TOTPDevice.objects.create(user=operator, name="phone", confirmed=True)
    client = Client()
    client.force_login(operator)
    client.post("/account/two-factor/verify/", {"token": code_for(device)})
    resp = client.post("/account/two-factor/", {"token": code_for(device, offset=1)})
    assert resp.status_code == 400 and "must keep" in resp.content.decode()
    assert TOTPDevice.objects.filter(user=operator, confirmed=True).exists()


def test_oidc_backend_matches_verified_addresses_only(make_user, settings):
    from portal.oidc import EmailOIDCBackend

    user = make_user("Sso@Example.org".lower())
    backend = EmailOIDCBackend.__new__(EmailOIDCBackend)  # no provider settings needed here
    assert backend.verify_claims({"email": "sso@example.org", "email_verified": True})
    assert not backend.verify_claims({"email": "sso@example.org"})
    assert list(
        backend.filter_users_by_claims({"email": "SSO@example.org", "email_verified": True})
    ) == [user]
    assert not backend.filter_users_by_claims(
        {"email": "sso@example.org", "email_verified": False}
    ).exists()


@pytest.mark.urls("tests.portal.oidc_urls")
def test_oidc_sign_in_starts_at_the_provider_when_configured(client, settings):
    settings.OIDC_ENABLED = True
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "mozilla_django_oidc"]
    settings.OIDC_RP_CLIENT_ID = "portal-client"
    settings.OIDC_RP_CLIENT_SECRET = "secret"
    settings.OIDC_OP_AUTHORIZATION_ENDPOINT = "https://idp.example.org/authorize"
    settings.OIDC_OP_TOKEN_ENDPOINT = "https://idp.example.org/token"
    settings.OIDC_OP_USER_ENDPOINT = "https://idp.example.org/userinfo"
    settings.OIDC_OP_JWKS_ENDPOINT = "https://idp.example.org/jwks"
    assert "Sign in with your organisation" in client.get("/login/").content.decode()
    resp = client.get("/oidc/authenticate/")
    assert resp.status_code == 302
    location = resp["Location"]
    assert location.startswith("https://idp.example.org/authorize?")
    assert "client_id=portal-client" in location and "state=" in location and "nonce=" in location


def test_login_page_has_no_sso_button_by_default(client):
    assert "Sign in with your organisation" not in client.get("/login/").content.decode()


def test_session_rules_apply_to_sessions_and_leave_bearer_tokens_alone(make_user, settings):
    """The two-factor rule and the idle timeout are about sessions: a request with the session
    cookie meets them; one without (a bearer token) has no session user to check, and its
    answer is the same as ever (`Vary: Cookie` included)."""
    from portal.middleware import IDLE_KEY
    from portal.services import token_create

    operator = make_user("op3@example.org", staff=True)
    secret = token_create(user=operator, name="t").secret
    session = Client()
    session.force_login(operator)
    assert session.get("/api/v1/projects/").status_code == 403  # unverified operator's session
    bearer = Client()
    resp = bearer.get("/api/v1/projects/", headers={"Authorization": f"Bearer {secret}"})
    assert resp.status_code == 200 and "Cookie" in resp["Vary"]
    assert "sessionid" not in resp.cookies
    settings.OTP_REQUIRED_FOR_STAFF = False
    settings.SESSION_IDLE_SECONDS = 60
    store = session.session
    store[IDLE_KEY] = 0  # last seen in 1970
    store.save()
    resp = session.get("/tokens/")
    assert resp.status_code == 302 and "/login/" in resp["Location"]  # idle: signed out
    resp = bearer.get("/api/v1/projects/", headers={"Authorization": f"Bearer {secret}"})
    assert resp.status_code == 200
