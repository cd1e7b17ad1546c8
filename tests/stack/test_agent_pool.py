"""Nodes first: the agent API runs in its own gunicorn pool (config.wsgi_agent), so user traffic
at three times what the web pool can serve does not delay heartbeats, and no node is lost."""

from __future__ import annotations

import statistics
import threading
import time
from pathlib import Path

import pytest
import requests

from scheduler.models import Node
from scheduler.nodes import lost_nodes_sweep
from tests.stack_fixtures import Web

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def pools(tmp_path: Path):
    web = Web(tmp_path / "web.log", workers=1, threads=1)  # capacity: one request at a time
    agent = Web(tmp_path / "agent.log", app="config.wsgi_agent", threads=4, probe="/healthz")
    web.start()
    agent.start()
    yield web, agent
    web.stop()
    agent.stop()


def test_user_traffic_cannot_starve_heartbeats(pools, fleet, settings):
    web, agent = pools
    # The agent pool serves only agents and probes.
    assert requests.get(agent.url + "/login/", timeout=5).status_code == 404
    assert requests.get(agent.url + "/healthz", timeout=5).status_code == 200

    stop = threading.Event()
    served = []

    def user() -> None:  # one of three users hammering a page as fast as it answers
        session = requests.Session()
        while not stop.is_set():
            try:
                served.append(session.get(web.url + "/api/schema/", timeout=30).status_code)
            except requests.RequestException:
                served.append(0)

    users = [threading.Thread(target=user) for _ in range(3)]  # 3x the web pool's capacity
    for t in users:
        t.start()
    latencies: list[float] = []
    try:
        time.sleep(1)  # the web pool is saturated before the first heartbeat
        sessions = {name: requests.Session() for name in fleet["tokens"]}
        for _ in range(12):
            for name, token in fleet["tokens"].items():
                started = time.perf_counter()
                resp = sessions[name].post(
                    agent.url + "/api/agent/v1/heartbeat",
                    json={"telemetry": [], "running": []},
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=10,
                )
                latencies.append(time.perf_counter() - started)
                assert resp.status_code == 200, resp.text
            time.sleep(0.25)
    finally:
        stop.set()
        for t in users:
            t.join(timeout=60)
    assert served, "the users' traffic never reached the web pool"
    p99 = statistics.quantiles(latencies, n=100)[98]
    assert p99 < 1.0, f"heartbeat p99 {p99:.3f}s under user load"
    settings.NODE_LOST_AFTER_SECONDS = 30
    assert lost_nodes_sweep() == []
    assert not Node.objects.filter(state=Node.State.LOST).exists()
