"""The agent's request gate (scheduler/agent_api/gate.py): token, throttle and assignment
version in one Redis round trip, with revocation as prompt as before."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.core.cache import cache
from hypothesis import given, settings
from hypothesis import strategies as st
from redis import Redis
from rest_framework.test import APIClient

from scheduler.agent_api.fastparse import idle_sync as _idle_sync
from scheduler.agent_api.serializers import SyncSerializer
from scheduler.agent_api.views import AgentThrottle
from scheduler.nodes import AGENT_TOKEN_TTL_S, agent_token_hash, agent_token_key, node_set_state

SYNC = "/api/agent/v1/sync"


def agent(token: str) -> APIClient:
    c = APIClient()
    c.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return c


@pytest.mark.django_db
def test_an_idle_sync_is_one_redis_command_and_no_sql(
    fleet, monkeypatch, django_assert_num_queries
):
    client = agent(fleet["tokens"]["h1"])
    version = client.post(SYNC, {}, format="json").json()["version"]
    commands: list[str] = []
    real = Redis.execute_command

    def counted(self: Redis, *args: object, **options: object) -> object:
        commands.append(str(args[0]))
        return real(self, *args, **options)

    monkeypatch.setattr(Redis, "execute_command", counted)
    with django_assert_num_queries(0):
        answer = client.post(SYNC, {"version": version, "reports": []}, format="json").json()
    assert answer == {"unchanged": True, "version": version, "results": []}
    assert commands == ["EVALSHA"]


@pytest.mark.django_db
def test_the_agent_throttle_still_counts_each_request(fleet, monkeypatch):
    rates = {**AgentThrottle.THROTTLE_RATES, "agent": "3/min"}
    monkeypatch.setattr(AgentThrottle, "THROTTLE_RATES", rates)
    client = agent(fleet["tokens"]["h1"])
    statuses = [client.post(SYNC, {}, format="json").status_code for _ in range(4)]
    assert statuses == [200, 200, 200, 429]
    refused = client.post(SYNC, {}, format="json")
    assert 1 <= int(refused["Retry-After"]) <= 60
    # per node: another node's agent is not held back
    assert agent(fleet["tokens"]["h2"]).post(SYNC, {}, format="json").status_code == 200


@pytest.mark.django_db
def test_a_retired_nodes_token_stops_at_once_even_for_an_idle_sync(
    fleet, make_user, django_capture_on_commit_callbacks
):
    client, node = agent(fleet["tokens"]["h1"]), fleet["nodes"]["h1"]
    version = client.post(SYNC, {}, format="json").json()["version"]  # token now in the cache
    assert client.post(SYNC, {"version": version}, format="json").json()["unchanged"] is True
    operator = make_user(staff=True)
    with django_capture_on_commit_callbacks(execute=True):
        node_set_state(actor=operator, node=node, action="cordon")
        node_set_state(actor=operator, node=node, action="retire")
    assert client.post(SYNC, {"version": version}, format="json").status_code == 401


@pytest.mark.django_db
def test_the_cache_vouches_for_a_token_at_most_agent_token_ttl(fleet):
    """The bound when the forget on revocation is lost (Redis briefly unreachable): an idle
    sync, which reads and writes nothing of the node's, is answered `unchanged` for at most
    AGENT_TOKEN_TTL_S more; every other request checks the token in the database."""
    client = agent(fleet["tokens"]["h1"])
    client.post(SYNC, {}, format="json")
    key = cache.make_key(agent_token_key(agent_token_hash(fleet["tokens"]["h1"])))
    from foundation.locks import redis_client

    ttl = redis_client().ttl(key)  # the cache's Redis (REDIS_URL), read as Redis
    assert 0 < ttl <= AGENT_TOKEN_TTL_S == 30


@pytest.mark.django_db(transaction=True)  # the reports' commit drops the version mid-request
def test_a_sync_with_reports_reads_the_version_after_applying_them(placed):
    """An exit ends the allocation and drops the version; the answer must not say unchanged
    on the strength of the version read before the report was applied."""
    client, job = placed["client"], placed["job"]
    version = client.post(SYNC, {}, format="json").json()["version"]
    started = {"kind": "started", "job_id": job.pk, "attempt": 1}
    client.post(SYNC, {"version": version, "reports": [started]}, format="json")
    version = client.post(SYNC, {}, format="json").json()["version"]
    exited = {"kind": "exited", "job_id": job.pk, "attempt": 1, "exit_code": 0, "reason": "exited"}
    answer = client.post(SYNC, {"version": version, "reports": [exited]}, format="json").json()
    assert answer["unchanged"] is False and answer["assignments"] == []


_values = st.none() | st.booleans() | st.integers(-2, 2) | st.text(max_size=5) | st.just("")
_odd_bodies = st.dictionaries(
    st.sampled_from(["version", "reports", "assignments", "other"]),
    _values | st.sampled_from(["ab12", " ab12", "AB12", "f" * 64, "f" * 65]) | st.just([]),
    max_size=4,
)
# Idle syncs as agents send them (the shortcut answers these), and odd bodies (it declines most).
_idle_bodies = st.fixed_dictionaries(
    {},
    optional={
        "version": st.none() | st.just("") | st.from_regex(r"\A[0-9a-f]{1,64}\Z"),
        "reports": st.just([]),
        "assignments": st.booleans(),
    },
)
_sync_bodies = _idle_bodies | _odd_bodies


def test_the_idle_sync_shortcut_agrees_with_the_serializer():
    """Whatever the shortcut parses, the serializer parses the same; the rest it leaves."""
    compared: list[Any] = []

    @settings(max_examples=300, deadline=None, database=None)
    @given(_sync_bodies)
    def check(body: Any) -> None:
        parsed = _idle_sync(body)
        if parsed is None:
            return  # the serializer's to decide
        compared.append(body)
        serializer = SyncSerializer(data=body)
        assert serializer.is_valid(), serializer.errors
        # as JSON text: with ==, 0 and False (or 1 and 1.0) would pass for the same answer
        assert json.dumps(parsed, sort_keys=True) == json.dumps(
            serializer.validated_data, sort_keys=True
        )

    check()
    assert len(compared) >= 75, len(compared)  # about 40% reach the comparison; a quarter at least
    assert any(b.get("version") for b in compared) and any("version" not in b for b in compared)


def test_the_shortcut_takes_what_agents_send():
    assert _idle_sync({"version": "ab12", "reports": [], "assignments": True}) == {
        "version": "ab12",
        "reports": [],
        "assignments": True,
    }
    assert _idle_sync({"version": None, "reports": [], "assignments": False}) is not None
    assert _idle_sync({"reports": [{"kind": "started"}]}) is None
    assert _idle_sync({"assignments": "true"}) is None  # the serializer decides that one
