"""The portal's own defences, each tried against a live server (pytest-django's live_server:
the real URL conf, middleware, PostgreSQL and Redis) the way an attacker would."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import pytest
import requests
from rest_framework.throttling import AnonRateThrottle, ScopedRateThrottle

from foundation import ratelimit
from portal.models import ApiToken, AuditEvent, User
from scheduler.models import Job

pytestmark = pytest.mark.django_db(transaction=True)

PASSWORD = "right-password-123"


@pytest.fixture(autouse=True)
def _no_counts_from_earlier_tests():
    """Rate-limit windows and login failures live in Redis for minutes: start each test clean."""
    from foundation.locks import redis_client

    client = redis_client()
    for pattern in ("*:rl:*", "*:login-fail:*"):
        keys = list(client.scan_iter(pattern))
        if keys:
            client.delete(*keys)


@pytest.fixture
def pinned_window(monkeypatch):
    """All hits of a test in one rate-limit window (the clock pinned mid-window)."""
    start = 60 * (time.time() // 60) + 20.5
    monkeypatch.setattr(ratelimit, "clock", lambda: start)
    return start


def _csrf(session: requests.Session, url: str) -> str:
    html = session.get(url, timeout=10).text
    match = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', html)
    assert match, f"no CSRF token on {url}"
    return match.group(1)


def login(
    base: str, path: str, email: str, password: str, *, headers: dict[str, str] | None = None
) -> tuple[requests.Session, requests.Response]:
    session = requests.Session()
    session.headers.update(headers or {})
    url = base + path
    token = _csrf(session, url)
    resp = session.post(
        url,
        data={"username": email, "password": password, "csrfmiddlewaretoken": token},
        headers={"Referer": url},
        allow_redirects=False,
        timeout=10,
    )
    return session, resp


def logged_in(resp: requests.Response) -> bool:
    return resp.status_code == 302 and "login" not in resp.headers.get("Location", "")


@pytest.fixture
def staff(make_user: Callable[..., User]) -> User:
    return make_user("ops@example.org", staff=True, password=PASSWORD)


def test_the_admin_login_is_locked_out_like_the_login_page(live_server, staff, settings):
    for _ in range(settings.LOGIN_FAILURE_LIMIT):
        _, resp = login(live_server.url, "/admin/login/", staff.email, "wrong")
        assert not logged_in(resp)
    _, resp = login(live_server.url, "/admin/login/", staff.email, PASSWORD)
    assert not logged_in(resp), "the right password got in through the admin while locked"
    assert "Too many failed attempts" in resp.text
    # and the login page is locked for that account too: one lockout for every path
    _, resp = login(live_server.url, "/login/", staff.email, PASSWORD)
    assert not logged_in(resp)
    assert AuditEvent.objects.filter(action="auth.login_locked").count() == 2


def test_failures_from_one_address_do_not_lock_other_accounts_behind_it(
    live_server, make_user, settings, pinned_window
):
    victim = make_user("colleague@example.org", password=PASSWORD)
    for n in range(20):  # a guesser on the same campus NAT, trying many accounts
        _, resp = login(live_server.url, "/login/", f"guess{n % 3}@example.org", "wrong")
        assert not logged_in(resp)
    _, resp = login(live_server.url, "/login/", victim.email, PASSWORD)
    assert logged_in(resp), "an address's failures locked out an account that never failed"


@pytest.mark.parametrize("path", ["/login/", "/admin/login/"])
def test_login_attempts_per_address_are_rate_limited(
    live_server, make_user, settings, pinned_window, path
):
    settings.LOGIN_RATE = "3/min"
    statuses = [
        login(live_server.url, path, f"nobody{n}@example.org", "wrong")[1].status_code
        for n in range(4)
    ]
    assert statuses == [200, 200, 200, 429]


def test_a_spoofed_forwarded_for_does_not_reset_the_anonymous_limit(
    live_server, monkeypatch, pinned_window
):
    monkeypatch.setattr(
        AnonRateThrottle, "THROTTLE_RATES", {**AnonRateThrottle.THROTTLE_RATES, "anon": "3/min"}
    )
    statuses = [
        requests.get(
            live_server.url + "/api/schema/",  # open to anonymous callers, so throttled as such
            headers={"X-Forwarded-For": f"198.51.100.{n}"},
            timeout=10,
        ).status_code
        for n in range(5)
    ]
    assert 429 in statuses, statuses


def test_a_trusted_proxy_names_the_client(live_server, settings, staff):
    settings.TRUSTED_PROXIES = ["127.0.0.1/32"]
    login(
        live_server.url,
        "/login/",
        staff.email,
        PASSWORD,
        headers={"X-Forwarded-For": "203.0.113.7, 10.9.9.9"},
    )
    # 10.9.9.9 is not a trusted proxy, so it is the client; the spoofable left part is ignored
    event = AuditEvent.objects.filter(action="auth.login").latest("pk")
    assert str(event.remote_addr) == "10.9.9.9"
    settings.TRUSTED_PROXIES = []
    login(live_server.url, "/login/", staff.email, PASSWORD, headers={"X-Forwarded-For": "1.2.3.4"})
    event = AuditEvent.objects.filter(action="auth.login").latest("pk")
    assert str(event.remote_addr) == "127.0.0.1"


def _submit_form(session: requests.Session, base: str, **fields: str) -> requests.Response:
    url = base + "/jobs/new/"
    token = _csrf(session, url)
    data = {
        "project": "alpha",
        "name": "flood",
        "command": "true",
        "shape": "whole",
        "gpus": "1",
        "priority": "1",
        "csrfmiddlewaretoken": token,
        **fields,
    }
    return session.post(url, data=data, headers={"Referer": url}, allow_redirects=False, timeout=10)


def test_the_web_form_spends_the_submit_limit_per_shard(
    live_server, team, fleet, monkeypatch, pinned_window
):
    monkeypatch.setattr(
        ScopedRateThrottle,
        "THROTTLE_RATES",
        {**ScopedRateThrottle.THROTTLE_RATES, "submit": "3/min"},
    )
    member = team["member"]
    member.set_password(PASSWORD)
    member.save()
    session, resp = login(live_server.url, "/login/", member.email, PASSWORD)
    assert logged_in(resp)
    assert _submit_form(session, live_server.url).status_code == 302
    over = _submit_form(session, live_server.url, shard_count="3")
    assert over.status_code == 429
    assert "rate limit" in over.text and 'value="flood"' in over.text  # inputs kept
    assert Job.objects.filter(name="flood").count() == 1


def test_the_api_counts_array_shards_against_the_submit_limit(
    live_server, team, fleet, monkeypatch, pinned_window
):
    from portal.services import token_create

    monkeypatch.setattr(
        ScopedRateThrottle,
        "THROTTLE_RATES",
        {**ScopedRateThrottle.THROTTLE_RATES, "submit": "5/min"},
    )
    secret = token_create(user=team["member"], name="t").secret
    resp = requests.post(
        live_server.url + "/api/v1/jobs",
        json={"project": "alpha", "name": "arr", "command": "true", "shard_count": 10},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=10,
    )
    assert resp.status_code == 429, resp.text
    assert "10 shards" in resp.text
    assert not Job.objects.filter(name="arr").exists()


def test_a_project_has_a_cap_on_queued_jobs(live_server, team, fleet, settings):
    from portal.services import token_create

    settings.PROJECT_MAX_QUEUED_JOBS = 4
    secret = token_create(user=team["member"], name="t").secret
    headers = {"Authorization": f"Bearer {secret}"}
    body = {"project": "alpha", "name": "q", "command": "true", "shard_count": 3}
    first = requests.post(live_server.url + "/api/v1/jobs", json=body, headers=headers, timeout=10)
    assert first.status_code == 201
    second = requests.post(live_server.url + "/api/v1/jobs", json=body, headers=headers, timeout=10)
    assert second.status_code == 429
    assert "cap is 4" in second.text
    assert Job.objects.filter(project=team["a"]).count() == 3  # the refused three wrote nothing


def test_an_array_request_cannot_blow_up_into_megabytes_of_rows(live_server, team, fleet):
    from portal.services import token_create

    secret = token_create(user=team["member"], name="t").secret
    body = {
        "project": "alpha",
        "name": "big",
        "command": "x" * 9000,
        "env": {f"K{n}": "v" * 3000 for n in range(10)},
        "shard_count": 1000,
    }
    resp = requests.post(
        live_server.url + "/api/v1/jobs",
        json=body,
        headers={"Authorization": f"Bearer {secret}"},
        timeout=30,
    )
    assert resp.status_code == 400, resp.text
    assert "shard_count" in resp.text
    assert not Job.objects.filter(name="big").exists()


@pytest.mark.parametrize("after", ["²", "٣", "9" * 5000, "9" * 30, "-1"])
def test_odd_numbers_in_query_strings_are_4xx_not_500(live_server, team, fleet, after):
    from portal.services import token_create
    from scheduler.admission import JobSpec, job_submit

    job = job_submit(
        actor=team["member"], project=team["a"], spec=JobSpec(name="j", command="true")
    )[0]
    secret = token_create(user=team["member"], name="t").secret
    headers = {"Authorization": f"Bearer {secret}"}
    api = requests.get(
        f"{live_server.url}/api/v1/jobs/{job.pk}/logs",
        params={"after": after},
        headers=headers,
        timeout=10,
    )
    assert api.status_code == 400, api.text
    listing = requests.get(
        f"{live_server.url}/api/v1/jobs", params={"limit": after}, headers=headers, timeout=10
    )
    assert listing.status_code == 400
    catalog = requests.get(
        f"{live_server.url}/api/v1/gpu-models",
        params={"offset": after},
        headers=headers,
        timeout=10,
    )
    assert catalog.status_code in (200, 400)  # never a 500


def test_an_oversized_gpu_memory_in_the_form_is_a_field_error(live_server, team, fleet):
    member = team["member"]
    member.set_password(PASSWORD)
    member.save()
    session, _ = login(live_server.url, "/login/", member.email, PASSWORD)
    resp = _submit_form(
        session, live_server.url, shape="fraction", gpu_milli="500", gpu_memory_mib="9" * 25
    )
    assert resp.status_code == 400
    assert "less than or equal to" in resp.text
    assert not Job.objects.exists()


def test_token_scopes_and_expiry_hold_on_the_live_api(live_server, team, fleet):
    from datetime import timedelta

    from django.utils import timezone

    from portal.services import token_create

    base = live_server.url
    body = {"project": "alpha", "name": "s", "command": "true"}

    def call(method: str, path: str, secret: str, **kw: object) -> requests.Response:
        return requests.request(
            method, base + path, headers={"Authorization": f"Bearer {secret}"}, timeout=10, **kw
        )

    read = token_create(user=team["member"], name="r", scope="read").secret
    assert call("GET", "/api/v1/jobs", read).status_code == 200
    refused = call("POST", "/api/v1/jobs", read, json=body)
    assert refused.status_code == 403 and "scope" in refused.text
    assert call("POST", "/api/v1/tokens/", read, json={"name": "x"}).status_code == 403

    submit = token_create(user=team["member"], name="s", scope="submit").secret
    job = call("POST", "/api/v1/jobs", submit, json=body)
    assert job.status_code == 201
    assert call("POST", f"/api/v1/jobs/{job.json()['id']}/cancel", submit).status_code == 200
    assert call("POST", "/api/v1/tokens/", submit, json={"name": "x"}).status_code == 403

    created = token_create(user=team["member"], name="e", scope="full", expires_in_days=1)
    assert call("GET", "/api/v1/jobs", created.secret).status_code == 200
    ApiToken.objects.filter(pk=created.token.pk).update(
        expires_at=timezone.now() - timedelta(seconds=1)
    )
    expired = call("GET", "/api/v1/jobs", created.secret)
    assert expired.status_code == 401 and "expired" in expired.text


def test_token_creation_takes_scope_and_expiry(live_server, team):
    from portal.services import token_create

    secret = token_create(user=team["member"], name="boot").secret
    resp = requests.post(
        live_server.url + "/api/v1/tokens/",
        json={"name": "ci", "scope": "read", "expires_in_days": 30},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=10,
    )
    assert resp.status_code == 201, resp.text
    assert resp.json()["scope"] == "read" and resp.json()["expires_at"]
    bad = requests.post(
        live_server.url + "/api/v1/tokens/",
        json={"name": "ci", "expires_in_days": 5000},
        headers={"Authorization": f"Bearer {secret}"},
        timeout=10,
    )
    assert bad.status_code == 400 and "expires_in_days" in bad.text


def test_an_idle_session_ends(live_server, make_user, settings):
    user = make_user(password=PASSWORD)
    session, resp = login(live_server.url, "/login/", user.email, PASSWORD)
    assert logged_in(resp)
    assert session.get(live_server.url + "/tokens/", allow_redirects=False).status_code == 200
    settings.SESSION_IDLE_SECONDS = 0
    time.sleep(1.1)
    resp = session.get(live_server.url + "/tokens/", allow_redirects=False, timeout=10)
    assert resp.status_code == 302 and "/login/" in resp.headers["Location"]
    assert AuditEvent.objects.filter(action="auth.logout", actor=user).exists()
