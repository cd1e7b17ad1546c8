"""The agent's watch on the running stack: the events service (uvicorn, as deployed) tells a
node agent, a real process, that its assignments changed, and the agent starts the job at once
instead of at its next poll."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from rest_framework.test import APIClient

from foundation import push
from portal.services import token_create
from scheduler.models import Job, JobState, Node
from tests.polling import wait_for
from tests.stack_fixtures import Web, wait_for_registration

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

POLL_S = 30  # the agent's own poll interval: far longer than any start these tests allow


@pytest.fixture
def events_service(tmp_path: Path):
    service = Web(
        tmp_path / "events.log",
        app="config.asgi_events",
        worker_class="uvicorn_worker.UvicornWorker",
        probe="/healthz",
        PUSH_STREAM_MAX_S="5",  # streams end (and agents reconnect) within these tests
    )
    service.start()
    yield service
    service.stop()


def watchers(node: Node) -> int:
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    ((_, count),) = client.pubsub_numsub(push.agent_channel(node.pk))
    return int(count)


def submit(url: str, user, command: str) -> int:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {token_create(user=user, name='w').secret}")
    body = {"project": "alpha", "name": "w", "gpu_model": "H100-80GB-SXM", "command": command}
    resp = client.post(f"{url}/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return int(resp.json()["id"])


def test_a_watching_agent_starts_a_placed_job_without_waiting_for_its_poll(
    celery_live_worker, agents, team, fleet, events_service, settings
):
    settings.AGENT_PORTAL_URL = agents.url
    Node.objects.exclude(name="h1").update(state=Node.State.CORDONED)  # only h1 has an agent
    agents.start(
        "h1",
        fleet["tokens"]["h1"],
        "2xH100-80GB-SXM",
        AGENT_POLL_INTERVAL=str(POLL_S),
        AGENT_EVENTS_URL=events_service.url,
    )
    wait_for_registration(["h1"])
    node = fleet["nodes"]["h1"]
    wait_for(lambda: watchers(node) == 1, timeout=20)  # the agent's stream is subscribed

    for attempt in range(2):
        if attempt:  # past the first stream's end: the agent has reconnected in between
            time.sleep(6)
            wait_for(lambda: watchers(node) == 1, timeout=10)
        submitted = time.monotonic()
        job_id = submit(agents.url, team["member"], "sleep 60")
        wait_for(lambda j=job_id: Job.objects.get(pk=j).state == JobState.RUNNING, timeout=10)
        assert time.monotonic() - submitted < 10  # its next poll was POLL_S away


def test_without_the_events_service_the_agent_polls_as_before(
    celery_live_worker, agents, team, fleet, settings
):
    settings.AGENT_PORTAL_URL = agents.url
    Node.objects.exclude(name="h1").update(state=Node.State.CORDONED)
    # The live server is WSGI: its /events/agent answers 204 (no push here).
    agents.start("h1", fleet["tokens"]["h1"], "2xH100-80GB-SXM", AGENT_POLL_INTERVAL="0.3")
    wait_for_registration(["h1"])
    assert watchers(fleet["nodes"]["h1"]) == 0
    job_id = submit(agents.url, team["member"], "sleep 60")
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING, timeout=20)
