"""bench.load tells an agent's idle sync from a busy one by the sizes gunicorn logs (the
capacity model prices them apart); the bodies here are the agent's own and the answers the
sync view's, so a protocol change that moves the sizes past the threshold fails here."""

from __future__ import annotations

import json

from bench.agent_swarm import request_class as swarm_class
from bench.load import request_class


def size(body: object) -> int:
    return len(json.dumps(body, separators=(",", ":")).encode())


VERSION = "0123456789abcdef"  # dispatch.assignments_version_mint: 8 random bytes in hex
IDLE_BODY = {"version": VERSION, "reports": [], "assignments": True}
IDLE_ANSWER = {"unchanged": True, "version": VERSION, "results": []}
STARTED = {"kind": "started", "job_id": 1, "attempt": 1, "pid": 4242}


def test_an_idle_sync_is_idle():
    assert request_class("POST", "/api/agent/v1/sync", size(IDLE_ANSWER), size(IDLE_BODY)) == (
        "idle sync"
    )
    assert swarm_class("/sync", json.dumps(IDLE_BODY).encode(), IDLE_ANSWER) == "idle sync"


def test_a_sync_with_a_report_is_busy():
    body = {**IDLE_BODY, "reports": [STARTED]}
    answer = {**IDLE_ANSWER, "results": [{"kind": "started", "job_id": 1, "attempt": 1}]}
    assert request_class("POST", "/api/agent/v1/sync", size(answer), size(body)) == "busy sync"
    assert swarm_class("/sync", json.dumps(body).encode(), answer) == "busy sync"


def test_a_sync_answered_in_full_is_busy_even_without_assignments():
    answer = {
        "unchanged": False,
        "version": VERSION,
        "fenced": False,
        "assignments": [],
        "results": [],
    }
    assert request_class("POST", "/api/agent/v1/sync", size(answer), size(IDLE_BODY)) == (
        "busy sync"
    )
    assert swarm_class("/sync", json.dumps(IDLE_BODY).encode(), answer) == "busy sync"


def test_the_other_classes():
    assert request_class("POST", "/api/agent/v1/heartbeat", 50, 5000) == "heartbeat"
    assert request_class("POST", "/api/agent/v1/jobs/3/logs", 20, 900) == "log append"
    assert request_class("POST", "/api/v1/jobs", 400, 100) == "submit"
    assert request_class("GET", "/api/v1/jobs?limit=20", 4000, 0) == "page view"
    assert request_class("GET", "/metrics", 9000, 0) == "metrics"
    assert request_class("GET", "/healthz", 10, 0) == "probe"
