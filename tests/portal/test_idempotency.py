"""Idempotency-Key: a retry gets the first answer and creates nothing; misuse is a clear 4xx."""

from __future__ import annotations

import threading
import uuid
from datetime import timedelta
from unittest import mock

import pytest
from django.db import connection, connections
from drf_spectacular.generators import SchemaGenerator
from rest_framework.test import APIClient

from portal.api.idempotency import unseal
from portal.models import ApiToken, IdempotencyKey
from scheduler.models import Job
from tests.polling import wait_for

pytestmark = pytest.mark.django_db

JOB = {"project": "alpha", "name": "train", "command": "python train.py"}


def _post(client, path, body, key):
    return client.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def test_a_retried_submit_gets_the_first_answer_and_creates_nothing(team, fleet, api):
    client = api(team["member"])
    key = str(uuid.uuid4())
    first = _post(client, "/api/v1/jobs", JOB, key)
    assert first.status_code == 201
    assert first["Location"] == f"/api/v1/jobs/{first.json()['id']}"
    assert client.get(first["Location"]).json()["id"] == first.json()["id"]
    again = _post(client, "/api/v1/jobs", JOB, key)
    assert again.status_code == 201
    assert again.json() == first.json()
    assert again["Location"] == first["Location"]
    assert again["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first
    assert Job.objects.count() == 1
    # Without a key, or with another key, the same body is a new job.
    assert client.post("/api/v1/jobs", JOB, format="json").status_code == 201
    assert _post(client, "/api/v1/jobs", JOB, str(uuid.uuid4())).status_code == 201
    assert Job.objects.count() == 3


def test_the_same_key_with_another_body_or_path_is_a_422(team, fleet, api):
    client = api(team["member"])
    first = _post(client, "/api/v1/jobs", JOB, "k-1")
    assert first.status_code == 201
    other = _post(client, "/api/v1/jobs", dict(JOB, name="other"), "k-1")
    assert other.status_code == 422
    body = other.json()
    assert body["code"] == "idempotency_key_reused"
    assert body["message"] == (
        "This Idempotency-Key was already used with a different body. "
        "Send a new key for a new request."
    )
    assert body["fields"] == {}
    elsewhere = _post(client, "/api/v1/jobs/dry-run", JOB, "k-1")
    assert elsewhere.status_code == 422
    assert "for POST /api/v1/jobs" in elsewhere.json()["message"]
    assert Job.objects.count() == 1


def test_keys_belong_to_their_user(team, fleet, api):
    for user in (team["member"], team["owner"]):
        resp = _post(api(user), "/api/v1/jobs", JOB, "shared-key")
        assert resp.status_code == 201 and "Idempotent-Replayed" not in resp
    assert Job.objects.count() == 2


def test_a_failed_request_keeps_no_answer_so_its_retry_runs(team, fleet, api):
    client = api(team["member"])
    bad = _post(client, "/api/v1/jobs", dict(JOB, gpu_model="H999"), "k-2")
    assert bad.status_code == 400
    assert bad.json()["fields"]["gpu_model"][0].startswith("Unknown GPU model 'H999'.")
    # The client fixes its request and retries with the same key: it runs.
    ok = _post(client, "/api/v1/jobs", JOB, "k-2")
    assert ok.status_code == 201 and "Idempotent-Replayed" not in ok
    assert Job.objects.count() == 1


def test_a_malformed_key_is_a_400_naming_the_header(team, fleet, api):
    client = api(team["member"])
    for key in ["", "x" * 256, "with space"]:
        resp = _post(client, "/api/v1/jobs", JOB, key)
        assert resp.status_code == 400, key
        assert list(resp.json()["fields"]) == ["Idempotency-Key"]
    assert Job.objects.count() == 0


def test_cancel_and_token_creation_replay(team, fleet, api):
    client = api(team["member"])
    job_id = client.post("/api/v1/jobs", JOB, format="json").json()["id"]
    first = _post(client, f"/api/v1/jobs/{job_id}/cancel", None, "c-1")
    assert first.status_code == 200 and first.json()["state"] == "cancelled"
    again = _post(client, f"/api/v1/jobs/{job_id}/cancel", None, "c-1")
    assert again.status_code == 200 and again.json() == first.json()
    assert again["Idempotent-Replayed"] == "true"

    made = _post(client, "/api/v1/tokens", {"name": "ci"}, "t-1")
    assert made.status_code == 201 and made["Location"] == f"/api/v1/tokens/{made.json()['id']}"
    assert client.get(made["Location"]).json()["name"] == "ci"
    remade = _post(client, "/api/v1/tokens", {"name": "ci"}, "t-1")
    assert remade.json()["token"] == made.json()["token"]  # the secret, once more, to its owner
    assert ApiToken.objects.filter(user=team["member"]).count() == 1


def test_the_stored_answer_holds_no_secret_in_the_clear(team, api):
    made = _post(api(team["member"]), "/api/v1/tokens", {"name": "ci"}, "t-secret")
    secret = made.json()["token"]
    row = IdempotencyKey.objects.get(user=team["member"])
    stored = " ".join(str(v) for v in row.__dict__.values())
    assert secret not in stored and "t-secret" not in stored
    assert secret in unseal("t-secret", row.response_sealed).decode()


def test_an_expired_key_runs_again(team, fleet, api):
    client = api(team["member"])
    assert _post(client, "/api/v1/jobs", JOB, "old").status_code == 201
    IdempotencyKey.objects.update(
        created_at=IdempotencyKey.objects.get().created_at - timedelta(hours=25)
    )
    resp = _post(client, "/api/v1/jobs", JOB, "old")
    assert resp.status_code == 201 and "Idempotent-Replayed" not in resp
    assert Job.objects.count() == 2
    assert IdempotencyKey.objects.count() == 1  # the expired row is gone


def test_every_post_of_the_public_api_declares_the_key_and_its_422():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    posts = [
        (path, op)
        for path, ops in schema["paths"].items()
        if path.startswith("/api/v1/")
        for method, op in ops.items()
        if method == "post"
    ]
    assert len(posts) >= 7
    for path, op in posts:
        names = [p["name"] for p in op.get("parameters", [])]
        assert "Idempotency-Key" in names, path
        assert "422" in op["responses"], path
        error = op["responses"]["400"]["content"]["application/json"]["schema"]
        if "$ref" in error:  # an endpoint's own error component (the manifest's refusals)
            error = schema["components"]["schemas"][error["$ref"].rsplit("/", 1)[1]]
        assert {"code", "message", "fields"} <= set(error["required"]), path


@pytest.mark.django_db(transaction=True)
def test_concurrent_retries_run_once(team, fleet):
    """The second request waits on the first one's key, then gets its answer."""
    from portal.services import token_create
    from scheduler.api import jobs as jobs_api

    secret = token_create(user=team["member"], name="race").secret
    inside, release = threading.Event(), threading.Event()
    real_submit = jobs_api.job_submit

    def slow_submit(**kwargs):
        inside.set()
        assert release.wait(30)
        return real_submit(**kwargs)

    answers: dict[str, object] = {}

    def send(name: str) -> None:
        try:
            client = APIClient()
            client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
            answers[name] = _post(client, "/api/v1/jobs", JOB, "race-key")
        finally:
            connections.close_all()

    with mock.patch.object(jobs_api, "job_submit", slow_submit):
        first = threading.Thread(target=send, args=("first",))
        first.start()
        assert inside.wait(30)
        second = threading.Thread(target=send, args=("second",))
        second.start()
        _wait_for_a_lock_wait()
        release.set()
        first.join(30)
        second.join(30)
    a, b = answers["first"], answers["second"]
    assert a.status_code == b.status_code == 201  # type: ignore[attr-defined]
    assert a.json() == b.json()  # type: ignore[attr-defined]
    assert b["Idempotent-Replayed"] == "true"  # type: ignore[index]
    assert Job.objects.count() == 1


def _wait_for_a_lock_wait() -> None:
    """Until a backend of this database waits on a lock (the second request on the key's row)."""

    def waiting() -> int:
        with connection.cursor() as cur:
            cur.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
            return cur.fetchone()[0]

    wait_for(waiting, timeout=30)  # the second request waits on the first one's key
