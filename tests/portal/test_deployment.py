"""What a deployment leans on: probes for the load balancer, request ids in JSON logs, and
production settings that refuse to start on the embedded fallbacks."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from portal.logs import JsonFormatter, RequestIdFilter, request_id

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.django_db
def test_healthz_answers_without_touching_anything(client, django_assert_num_queries):
    with django_assert_num_queries(0):
        resp = client.get("/healthz")
    assert resp.status_code == 200 and resp.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_checks_the_database_the_cache_and_the_broker(client):
    resp = client.get("/readyz")
    assert resp.status_code == 200, resp.content
    checks = resp.json()["checks"]
    assert set(checks) == {"database", "cache", "broker"}
    assert all(c["ok"] for c in checks.values())


@pytest.mark.django_db
def test_readyz_is_503_and_names_what_is_down(client, settings):
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": "redis://127.0.0.1:1/0",  # nothing listens there
        }
    }
    resp = client.get("/readyz")
    assert resp.status_code == 503
    body = resp.json()
    assert body["status"] == "not ready"
    assert body["checks"]["cache"]["ok"] is False and body["checks"]["cache"]["error"]
    assert body["checks"]["database"]["ok"] is True


@pytest.mark.django_db
def test_every_answer_carries_a_request_id(client):
    mine = client.get("/healthz", HTTP_X_REQUEST_ID="lb-0123456789abcdef")
    assert mine["X-Request-ID"] == "lb-0123456789abcdef"
    odd = client.get("/healthz", HTTP_X_REQUEST_ID="<script>")
    assert odd["X-Request-ID"] != "<script>" and len(odd["X-Request-ID"]) == 32


def test_json_log_lines_carry_the_request_id():
    record = logging.LogRecord("portal", logging.WARNING, __file__, 1, "cycle took %ss", (3,), None)
    token = request_id.set("req-42424242")
    try:
        RequestIdFilter().filter(record)
    finally:
        request_id.reset(token)
    line = json.loads(JsonFormatter().format(record))
    assert line["request_id"] == "req-42424242"
    assert line["message"] == "cycle took 3s" and line["level"] == "WARNING"


def _production(
    code: str = "import django; django.setup()", **env: str
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in {"REDIS_URL", "DJANGO_SETTINGS_MODULE"}}
    base.update(
        DJANGO_SETTINGS_MODULE="config.settings.production",
        DJANGO_SECRET_KEY="x" * 50,
        DATABASE_URL="postgres://portal@db.invalid/portal",
        DJANGO_ALLOWED_HOSTS="portal.example.org",
        **env,
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=base,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_production_refuses_to_start_without_redis():
    result = _production()
    assert result.returncode != 0
    assert "Production needs REDIS_URL" in result.stderr


def test_production_refuses_a_redis_without_a_password():
    result = _production(REDIS_URL="redis://redis.internal:6379/0")
    assert result.returncode != 0
    assert "REDIS_URL has no password" in result.stderr


def test_production_starts_with_a_password_protected_redis():
    result = _production(REDIS_URL="redis://:s3cret@redis.internal:6379/0")
    assert result.returncode == 0, result.stderr


def test_production_uses_the_portal_postgresql_backend():
    """Its health check costs no round trip (foundation/db_backends/postgresql), and its name still
    ends in "postgresql" for the settings that check it (prepared statements)."""
    result = _production(
        "import django; django.setup(); from django.conf import settings; "
        "d = settings.DATABASES['default']; print(d['ENGINE'], d['CONN_HEALTH_CHECKS'], "
        "d['OPTIONS'].get('prepare_threshold'))",
        REDIS_URL="redis://:s3cret@redis.internal:6379/0",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["foundation.db_backends.postgresql", "True", "5"]
