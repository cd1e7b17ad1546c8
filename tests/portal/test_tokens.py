"""Personal API tokens: hashed at rest, shown once, revocable, usable as Bearer."""

from __future__ import annotations

import hashlib
import logging

import pytest
from rest_framework.test import APIClient

from portal.models import ApiToken, AuditEvent

pytestmark = pytest.mark.django_db


def create_token(api, user, name="laptop") -> dict:
    resp = api(user).post("/api/v1/tokens/", {"name": name}, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


def test_token_is_stored_hashed_and_works_as_bearer(make_user, api):
    user = make_user()
    body = create_token(api, user)
    secret = body["token"]
    row = ApiToken.objects.get(pk=body["id"])
    assert row.token_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in {row.name, row.prefix, row.token_hash}
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/projects/").status_code == 200
    row.refresh_from_db()
    assert row.last_used_at is not None


def test_revoked_token_is_refused(make_user, api):
    user = make_user()
    body = create_token(api, user)
    assert api(user).delete(f"/api/v1/tokens/{body['id']}/").status_code == 204
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {body['token']}")
    resp = client.get("/api/v1/projects/")
    assert resp.status_code == 401
    assert "revoked" in resp.json()["detail"]
    assert AuditEvent.objects.filter(action="token.revoke", target_id=str(body["id"])).exists()


def test_wrong_and_malformed_bearer_headers_are_401(db):
    for header in ["Bearer gpc_nope", "Bearer", "Bearer a b", "Bearer " + "x" * 500]:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=header)
        assert client.get("/api/v1/projects/").status_code == 401, header


def test_cannot_revoke_someone_elses_token(make_user, api):
    alice, bob = make_user(), make_user()
    body = create_token(api, alice)
    assert api(bob).delete(f"/api/v1/tokens/{body['id']}/").status_code == 404
    assert ApiToken.objects.get(pk=body["id"]).revoked_at is None


def test_token_never_appears_in_listings_pages_or_logs(make_user, api, client, caplog):
    user = make_user()
    with caplog.at_level(logging.DEBUG):
        secret = create_token(api, user)["token"]
        listing = api(user).get("/api/v1/tokens/").content.decode()
        client.force_login(user)
        page = client.get("/tokens/").content.decode()
        bearer = APIClient()
        bearer.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        bearer.get("/api/v1/projects/")
    assert secret not in listing
    assert secret not in page
    assert secret not in caplog.text
    events = AuditEvent.objects.filter(action="token.create").values_list("data", flat=True)
    assert all(secret not in str(d) for d in events)


def test_token_page_shows_secret_once(make_user, client):
    user = make_user()
    client.force_login(user)
    created = client.post("/tokens/", {"name": "ci"})
    html = created.content.decode()
    token = ApiToken.objects.get(user=user)
    assert token.prefix in html and "gpc_" in html
    assert created["Cache-Control"] == "no-store"
    start = html.index('class="mono secret">') + len('class="mono secret">')
    secret = html[start : html.index("</pre>", start)]
    assert hashlib.sha256(secret.encode()).hexdigest() == token.token_hash
    assert secret not in client.get("/tokens/").content.decode()


def test_last_use_is_written_at_most_once_a_minute(make_user, api, django_assert_num_queries):
    from datetime import timedelta

    from django.utils import timezone

    from portal.services import token_authenticate

    user = make_user()
    secret = create_token(api, user)["token"]
    with django_assert_num_queries(2):  # the lookup, then the first use is recorded
        assert token_authenticate(raw=secret)[0] == user
    first = ApiToken.objects.get(user=user).last_used_at
    with django_assert_num_queries(1):  # used again within the minute: a read only
        assert token_authenticate(raw=secret)[0] == user
    assert ApiToken.objects.get(user=user).last_used_at == first
    ApiToken.objects.filter(user=user).update(last_used_at=first - timedelta(seconds=61))
    with django_assert_num_queries(2):
        assert token_authenticate(raw=secret)[0] == user
    assert ApiToken.objects.get(user=user).last_used_at > first - timedelta(seconds=1)
    assert ApiToken.objects.get(user=user).last_used_at <= timezone.now()


def test_a_deactivated_users_token_is_refused(make_user, api):
    user = make_user()
    secret = create_token(api, user)["token"]
    user.is_active = False
    user.save()
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/projects/").status_code == 401
