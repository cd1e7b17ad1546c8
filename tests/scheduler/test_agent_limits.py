"""What one node token may ask of the portal: bounded numbers, bounded heartbeats, and a
request rate that is what an agent needs with a stated margin, per kind of request."""

from __future__ import annotations

import math

import pytest
from django.conf import settings
from rest_framework.test import APIClient

from agent.protocol import MAX_HEARTBEAT_SAMPLES, MAX_SAMPLE_PROCESSES
from scheduler.agent_api import fastparse

pytestmark = pytest.mark.django_db

SYNC = "/api/agent/v1/sync"
HEARTBEAT = "/api/agent/v1/heartbeat"
BEYOND_64_BITS = 2**64


def agent(token: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


@pytest.mark.parametrize(
    "report",
    [
        {"kind": "started", "job_id": BEYOND_64_BITS, "attempt": 1},
        {"kind": "started", "job_id": 1, "attempt": BEYOND_64_BITS},
        {"kind": "started", "job_id": 1, "attempt": 2**31},  # attempts are 32-bit integers
        {"kind": "started", "job_id": 1, "attempt": 1, "pid": BEYOND_64_BITS},
        {
            "kind": "exited",
            "job_id": BEYOND_64_BITS,
            "attempt": 1,
            "exit_code": 0,
            "reason": "exited",
        },
    ],
)
def test_a_sync_naming_a_number_beyond_the_database_is_a_400(placed, report):
    resp = placed["client"].post(SYNC, {"reports": [report]}, format="json")
    assert resp.status_code == 400, resp.content
    assert "reports" in resp.json()


def test_heartbeats_and_logs_with_numbers_beyond_the_database_are_4xx(placed):
    client, job = placed["client"], placed["job"]
    running = {"telemetry": [], "running": [{"job_id": BEYOND_64_BITS, "attempt": 1}]}
    assert fastparse.plain_heartbeat(running) is None  # the serializer explains it
    resp = client.post(HEARTBEAT, running, format="json")
    assert resp.status_code == 400 and "running" in resp.json()
    log = {"attempt": 1, "seq": 2**40, "stream": "stdout", "text": "x"}
    resp = client.post(f"/api/agent/v1/jobs/{job.pk}/logs", log, format="json")
    assert resp.status_code == 400 and "seq" in resp.json()
    log["seq"] = 0
    resp = client.post(f"/api/agent/v1/jobs/{BEYOND_64_BITS}/logs", log, format="json")
    assert resp.status_code == 404
    resp = client.post(
        f"/api/agent/v1/jobs/{BEYOND_64_BITS}/started", {"attempt": 1}, format="json"
    )
    assert resp.status_code == 404


def _sample(gpu: int, processes: int = 0) -> dict:
    return {
        "uuid": f"GPU-{gpu}",
        "utilization": 10.0,
        "processes": [{"pid": p, "used_memory_mib": 1} for p in range(processes)],
        "age_s": 1.0,
    }


def test_a_heartbeat_carries_at_most_the_protocols_samples(placed):
    client = placed["client"]
    full = {"telemetry": [_sample(i % 64) for i in range(MAX_HEARTBEAT_SAMPLES)], "running": []}
    assert fastparse.plain_heartbeat(full) is not None
    assert client.post(HEARTBEAT, full, format="json").status_code == 200
    over = {**full, "telemetry": [*full["telemetry"], _sample(0)]}
    assert fastparse.plain_heartbeat(over) is None
    resp = client.post(HEARTBEAT, over, format="json")
    assert resp.status_code == 400 and "telemetry" in resp.json()
    crowded = {"telemetry": [_sample(0, MAX_SAMPLE_PROCESSES + 1)], "running": []}
    assert fastparse.plain_heartbeat(crowded) is None
    assert client.post(HEARTBEAT, crowded, format="json").status_code == 400
    assert MAX_HEARTBEAT_SAMPLES <= 512  # was 2,048: a quarter of the worst case's CPU


def _per_minute(rate: str) -> float:
    count, period = rate.split("/")
    return int(count) * {"s": 60, "m": 1, "h": 1 / 60}[period[0]]


def test_the_agent_rates_are_what_an_agent_needs_times_the_stated_margin():
    """An agent heartbeats every NODE_HEARTBEAT_SECONDS and syncs every AGENT_POLL_SECONDS
    (plus at most one sync of the starts a poll led to); each allowance is that, times
    AGENT_RATE_MARGIN, and no longer about 140 times it."""
    rates = settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]
    heartbeats = 60 / settings.NODE_HEARTBEAT_SECONDS
    syncs = 2 * 60 / settings.AGENT_POLL_SECONDS
    margin = settings.AGENT_RATE_MARGIN
    assert 2 <= margin <= 10
    assert _per_minute(rates["agent_heartbeat"]) == math.ceil(heartbeats * margin)
    assert _per_minute(rates["agent"]) == math.ceil(syncs * margin)


def test_heartbeats_past_the_allowance_are_429_and_syncs_and_logs_count_apart(placed):
    client, job = placed["client"], placed["job"]
    allowed = int(_per_minute(settings.REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]["agent_heartbeat"]))
    beat = {"telemetry": [], "running": []}
    statuses = [client.post(HEARTBEAT, beat, format="json").status_code for _ in range(allowed)]
    assert statuses == [200] * allowed
    refused = client.post(HEARTBEAT, beat, format="json")
    assert refused.status_code == 429 and int(refused["Retry-After"]) > 0
    assert client.post(SYNC, {}, format="json").status_code == 200  # its own window
    log = {"attempt": 1, "seq": 0, "stream": "stdout", "text": "hello\n"}
    assert client.post(f"/api/agent/v1/jobs/{job.pk}/logs", log, format="json").status_code == 201
