"""The agent API pool's application (config.wsgi_agent): its own, short middleware chain (no
sessions, CSRF, pages or static files), which still gives every answer its request id and
security headers, sees the client behind trusted proxies, and maps domain errors and database
conflicts as the web tier does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.conf import settings
from django.core.cache import cache
from django.core.handlers.wsgi import WSGIHandler
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, connection
from django.test import override_settings

from bench import wsgi_environ
from portal.models import AuditEvent
from scheduler.models import Node
from scheduler.nodes import agent_token_hash, agent_token_key

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parents[2]


def test_the_agent_entry_point_loads_the_agent_pool_middleware_and_the_web_its_own():
    def middleware(module: str) -> list[str]:
        code = (
            f"import json, {module}; from django.conf import settings; "
            "print(json.dumps(settings.MIDDLEWARE))"
        )
        env = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings.test"}
        env.pop("PORTAL_URLCONF", None)
        out = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert out.returncode == 0, out.stderr
        loaded: list[str] = json.loads(out.stdout.strip().splitlines()[-1])
        return loaded

    agent, web = middleware("config.wsgi_agent"), middleware("config.wsgi")
    assert agent == settings.AGENT_POOL_MIDDLEWARE
    assert web == settings.MIDDLEWARE and len(web) > len(agent)
    assert not any("session" in m.lower() or "csrf" in m.lower() for m in agent)


class Response:
    def __init__(self, status: str, headers: list[tuple[str, str]], body: bytes) -> None:
        self.status_code = int(status.split()[0])
        self.headers = dict(headers)
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class AgentPool:
    """The agent pool's WSGI application in this process, called with a WSGI environ."""

    def __init__(self) -> None:
        self.app = WSGIHandler()

    def call(
        self, method: str, path: str, token: str | None = None, body: Any = None, **headers: str
    ) -> Response:
        raw = json.dumps(body).encode() if body is not None else b""
        environ = wsgi_environ(method, path, raw, headers)
        if token:
            environ["HTTP_AUTHORIZATION"] = f"Bearer {token}"
        started: list[tuple[str, list[tuple[str, str]]]] = []
        result = self.app(environ, lambda s, h, exc=None: started.append((s, h)))
        body_out = b"".join(result)
        result.close()
        return Response(*started[0], body_out)


@pytest.fixture
def pool():
    # As Django's test client does: the test's connection (and its session settings) stays
    # open across requests, where a server would close it after each (CONN_MAX_AGE = 0).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        with override_settings(
            ROOT_URLCONF="config.urls_agent",
            MIDDLEWARE=settings.AGENT_POOL_MIDDLEWARE,
            TRUSTED_PROXIES=["10.0.0.1"],
        ):
            yield AgentPool()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def _beat(node: Node) -> dict[str, Any]:
    return {
        "telemetry": [
            {"uuid": g.uuid, "utilization": 50.0, "temperature_c": 60, "age_s": age}
            for g in node.gpus.order_by("index")
            for age in (0, 2)
        ],
        "running": [],
    }


def test_the_agent_pool_answers_syncs_and_heartbeats_with_ids_and_security_headers(pool, fleet):
    node, token = fleet["nodes"]["h1"], fleet["tokens"]["h1"]
    first = pool.call("POST", "/api/agent/v1/sync", token, {})
    assert first.status_code == 200, first.body
    version = first.json()["version"]
    idle = pool.call("POST", "/api/agent/v1/sync", token, {"version": version, "reports": []})
    assert idle.json() == {"unchanged": True, "version": version, "results": []}

    audits = AuditEvent.objects.count()
    beat = pool.call(
        "POST", "/api/agent/v1/heartbeat", token, _beat(node), X_REQUEST_ID="lb-0123456789abcdef"
    )
    assert beat.status_code == 200, beat.body
    assert beat.json() == {"ok": True, "fenced": False, "images": []}
    node.refresh_from_db()
    assert node.last_heartbeat_at is not None and node.state == Node.State.READY
    assert AuditEvent.objects.count() == audits  # a plain heartbeat changes no state
    headers = beat.headers
    assert headers["X-Request-ID"] == "lb-0123456789abcdef"
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["Referrer-Policy"] == "same-origin"
    assert headers["Cross-Origin-Opener-Policy"] == "same-origin"
    assert headers["Content-Length"] == str(len(beat.body))  # not chunked behind a balancer
    # no session, no CSRF cookie, nothing that varies by cookie
    assert "Set-Cookie" not in headers and "Cookie" not in headers.get("Vary", "")
    # agents and probes only: the web's pages are not here
    assert pool.call("GET", "/login/").status_code == 404
    assert pool.call("GET", "/healthz").json() == {"status": "ok"}
    # ALLOWED_HOSTS holds here too
    assert pool.call("GET", "/healthz", HOST="evil.example.org").status_code == 400


def test_audit_events_see_the_client_behind_a_trusted_proxy(pool, fleet):
    node, token = fleet["nodes"]["h1"], fleet["tokens"]["h1"]
    Node.objects.filter(pk=node.pk).update(fenced=True)
    forwarded = {"X_FORWARDED_FOR": "203.0.113.7"}
    answer = pool.call("POST", "/api/agent/v1/heartbeat", token, _beat(node), **forwarded)
    assert answer.status_code == 200 and answer.json()["fenced"] is False
    assert AuditEvent.objects.get(action="node.unfence").remote_addr == "127.0.0.1"  # untrusted

    Node.objects.filter(pk=node.pk).update(fenced=True)
    with override_settings(TRUSTED_PROXIES=["127.0.0.1"]):  # the peer is the load balancer
        answer = pool.call("POST", "/api/agent/v1/heartbeat", token, _beat(node), **forwarded)
    assert answer.status_code == 200
    unfenced = AuditEvent.objects.filter(action="node.unfence").order_by("pk")
    assert [e.remote_addr for e in unfenced] == ["127.0.0.1", "203.0.113.7"]


def test_domain_errors_and_database_conflicts_are_mapped_in_the_agent_pool(pool, fleet):
    node, token = fleet["nodes"]["h1"], fleet["tokens"]["h1"]
    stale = pool.call("POST", "/api/agent/v1/jobs/99999/started", token, {"attempt": 1})
    assert stale.status_code == 409 and stale.json()["code"] == "stale_attempt"
    assert pool.call("POST", "/api/agent/v1/heartbeat", "gpn_nope", _beat(node)).status_code == 401

    db = connection.settings_dict
    holder = psycopg.connect(
        host=db["HOST"] or None,
        port=db["PORT"] or None,
        user=db["USER"],
        password=db["PASSWORD"] or None,
        dbname=db["NAME"],
    )
    try:  # another transaction (the cycle, the lost-node sweep) holds the node's row
        holder.execute("SELECT 1 FROM scheduler_node WHERE id = %s FOR UPDATE", [node.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")
        busy = pool.call("POST", "/api/agent/v1/heartbeat", token, _beat(node))
        assert busy.status_code == 503, busy.body
        assert busy.headers["Retry-After"] == "1" and busy.json()["code"] == "retry"
    finally:
        holder.rollback()
        holder.close()
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")
    assert pool.call("POST", "/api/agent/v1/heartbeat", token, _beat(node)).status_code == 200


def test_a_heartbeat_whose_token_no_longer_names_a_live_node_records_nothing(pool, fleet):
    """The cache still vouches for the token (it forgets on commit; here it never heard),
    the database does not: 401, the cache forgets, the node's row is left alone."""
    node, token = fleet["nodes"]["h1"], fleet["tokens"]["h1"]
    assert pool.call("POST", "/api/agent/v1/heartbeat", token, _beat(node)).status_code == 200
    Node.objects.filter(pk=node.pk).update(state=Node.State.RETIRED)
    before = Node.objects.get(pk=node.pk).last_heartbeat_at
    assert cache.get(agent_token_key(agent_token_hash(token))) == node.pk

    refused = pool.call("POST", "/api/agent/v1/heartbeat", token, _beat(node))

    assert refused.status_code == 401
    assert Node.objects.get(pk=node.pk).last_heartbeat_at == before
    assert cache.get(agent_token_key(agent_token_hash(token))) is None
