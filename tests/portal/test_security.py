"""Login throttling, authentication audit, security headers, append-only audit, rate limits."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
from django.core.cache import cache
from django.db import DatabaseError, transaction

from portal.models import AuditEvent

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _clear_login_counters():
    keys = ["login-fail:email:victim@example.org", "login-fail:ip:127.0.0.1"]
    cache.delete_many(keys)
    yield
    cache.delete_many(keys)


def test_login_is_audited_with_address(make_user, client):
    user = make_user("victim@example.org")
    client.post("/login/", {"username": "victim@example.org", "password": "pw-123456"})
    event = AuditEvent.objects.get(action="auth.login")
    assert event.actor == user and event.remote_addr == "127.0.0.1"
    client.post("/logout/")
    assert AuditEvent.objects.filter(action="auth.logout", actor=user).exists()


def test_repeated_failures_lock_the_login(make_user, client, settings):
    make_user("victim@example.org")
    for _ in range(settings.LOGIN_FAILURE_LIMIT):
        resp = client.post("/login/", {"username": "victim@example.org", "password": "wrong"})
        assert "Too many" not in resp.content.decode()
    assert (
        AuditEvent.objects.filter(action="auth.login_failed").count()
        == settings.LOGIN_FAILURE_LIMIT
    )
    # Now even the right password is refused until the lockout passes.
    resp = client.post("/login/", {"username": "victim@example.org", "password": "pw-123456"})
    assert "Too many failed attempts" in resp.content.decode()
    assert "_auth_user_id" not in client.session


def test_security_headers_on_pages(make_user, client):
    client.force_login(make_user())
    resp = client.get("/")
    csp = resp["Content-Security-Policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert resp["X-Frame-Options"] == "DENY"
    assert resp["X-Content-Type-Options"] == "nosniff"
    assert "camera=()" in resp["Permissions-Policy"]


def test_audit_events_cannot_be_edited_or_deleted(make_user):
    user = make_user()
    from portal.audit import audit_record

    event = audit_record(actor=user, action="test.event")
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).update(action="forged")
    with pytest.raises(DatabaseError), transaction.atomic():
        AuditEvent.objects.filter(pk=event.pk).delete()
    # deleting the actor only clears the reference; the label stays
    label = event.actor_label
    user.delete()
    event.refresh_from_db()
    assert event.actor is None and event.actor_label == label


def test_submit_rate_limit(team, fleet, api, monkeypatch):
    from rest_framework.throttling import ScopedRateThrottle

    from foundation import ratelimit

    rates = {**ScopedRateThrottle.THROTTLE_RATES, "submit": "2/min"}
    monkeypatch.setattr(ScopedRateThrottle, "THROTTLE_RATES", rates)
    start = 60 * (time.time() // 60) + 50.2  # pinned: all three in one window, 9.8 s before its end
    monkeypatch.setattr(ratelimit, "clock", lambda: start)
    client = api(team["member"])
    body = {"project": "alpha", "name": "x", "command": "true"}
    responses = [client.post("/api/v1/jobs", body, format="json") for _ in range(3)]
    assert [r.status_code for r in responses] == [201, 201, 429]
    assert responses[2]["Retry-After"] == "10"
    assert "throttled" in responses[2].json()["detail"].lower()
    assert client.get("/api/v1/jobs").status_code == 200  # reads are not held back
    # the next window admits again; another user was never held back
    monkeypatch.setattr(ratelimit, "clock", lambda: start + 10)
    assert client.post("/api/v1/jobs", body, format="json").status_code == 201
    monkeypatch.setattr(ratelimit, "clock", lambda: start)
    assert api(team["owner"]).post("/api/v1/jobs", body, format="json").status_code == 201


def test_fixed_window_counts_every_concurrent_hit_in_one_round_trip(monkeypatch):
    """Racing hits each get their own count (nothing lost), and the window's key expires."""
    from django.core.cache import cache, caches
    from django.core.cache.backends.redis import RedisCache

    from foundation.ratelimit import window_hit

    assert isinstance(caches["default"], RedisCache)

    def two_round_trips(*args, **kwargs):
        raise AssertionError("the limiter must count with one pipelined round trip")

    monkeypatch.setattr(RedisCache, "add", two_round_trips)
    monkeypatch.setattr(RedisCache, "incr", two_round_trips)

    key, now = f"race-{uuid.uuid4().hex}", 1_000_020.0
    counts: list[int] = []
    lock = threading.Lock()

    def hammer() -> None:
        mine = [window_hit(key, 60, now=now)[0] for _ in range(50)]
        with lock:
            counts.extend(mine)

    threads = [threading.Thread(target=hammer) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(counts) == list(range(1, 401))
    from foundation.locks import redis_client

    window_key = cache.make_and_validate_key(f"rl:{key}:{int(now // 60)}")
    assert 0 < redis_client().ttl(window_key) <= 61  # the cache's Redis, read as Redis
    assert window_hit(key, 60, now=now + 59.5) == (401, 1)  # Retry-After: rest of the window
    assert window_hit(key, 60, now=now + 60) == (1, 60)  # a new window starts from one


def test_several_windows_count_in_one_script_each_with_its_own_period(monkeypatch):
    """A request's windows (the user's limit and the submit scope) count in one command,
    each with its own count, period and time to live; amounts add up (array shards)."""
    from django.core.cache import cache

    from foundation import ratelimit

    now = 2_000_010.0
    monkeypatch.setattr(ratelimit, "clock", lambda: now)
    a, b = f"a-{uuid.uuid4().hex}", f"b-{uuid.uuid4().hex}"
    assert ratelimit.window_hits([(a, 60), (b, 3600)]) == [(1, 30), (1, 1590)]
    assert ratelimit.window_hits([(a, 60), (b, 3600)]) == [(2, 30), (2, 1590)]
    assert ratelimit.window_hit(b, 3600, now=now, amount=5) == (7, 1590)
    from foundation.locks import redis_client

    client = redis_client()  # the cache's Redis (REDIS_URL), read as Redis
    for key, period in [(a, 60), (b, 3600)]:
        window_key = cache.make_and_validate_key(f"rl:{key}:{int(now // period)}")
        assert period - 10 < client.ttl(window_key) <= period + 1
