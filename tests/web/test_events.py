"""The pushed-updates stream (web/events.py) and what publishes to it (foundation/push.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures

import pytest
import redis
from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import transaction
from django.test import AsyncClient
from django.utils import timezone

from foundation import push
from monitoring.ingest import ingest_samples
from scheduler.admission import job_cancel
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Job
from scheduler.nodes.reports import job_log_append
from tests.scheduler.conftest import placed  # noqa: F401 (a fixture)

pytestmark = pytest.mark.django_db(transaction=True)


def _submit(api, user, **extra):
    body = {"project": "alpha", "name": "s", "command": "true", "gpu_model": "H100-80GB-SXM"}
    resp = api(user).post("/api/v1/jobs", {**body, **extra}, format="json")
    assert resp.status_code == 201, resp.content
    return Job.objects.get(pk=resp.json()["id"])


def _run(scenario) -> None:
    """Run an async scenario on its own loop in its own thread: a session's browser (Playwright's
    sync API) keeps an event loop running in the main thread, where async_to_sync refuses."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, scenario()).result()


async def _open(user, query):
    client = AsyncClient()
    await client.aforce_login(user)
    return await client.get(f"/events/?{query}")


def _events(chunks: bytes) -> list[str]:
    return [line[7:] for line in chunks.decode().splitlines() if line.startswith("event: ")]


def test_a_job_page_hears_of_its_job_after_commit_and_of_nothing_else(team, fleet, api):
    job = _submit(api, team["member"])
    other = _submit(api, team["member"])

    async def scenario():
        resp = await _open(team["member"], f"job={job.pk}")
        assert resp.status_code == 200 and resp["Content-Type"] == "text/event-stream"
        chunks = aiter(resp.streaming_content)
        assert _events(await anext(chunks)) == ["ready"]
        # another job of the same project changes: not this page's business
        await sync_to_async(job_cancel)(actor=team["member"], job=other)
        await sync_to_async(job_cancel)(actor=team["member"], job=job)
        got = await asyncio.wait_for(anext(chunks), timeout=10)
        assert _events(got) == ["job"] and f'"id":{job.pk}'.encode() in got

    _run(scenario)


def test_a_job_list_hears_of_submissions_in_its_projects_only(team, fleet, api):
    async def scenario():
        resp = await _open(team["member"], "queue=1")
        chunks = aiter(resp.streaming_content)
        assert _events(await anext(chunks)) == ["ready"]
        beta = {"project": "beta", "name": "b", "command": "true", "gpu_model": "L4"}
        resp = await sync_to_async(api(team["outsider"]).post)("/api/v1/jobs", beta, format="json")
        assert resp.status_code == 201, resp.content
        await sync_to_async(_submit)(api, team["member"])
        got = await asyncio.wait_for(anext(chunks), timeout=10)
        assert _events(got) == ["queue"]

    _run(scenario)


def test_log_appends_and_heartbeats_reach_the_job_page(placed):  # noqa: F811
    job, node = placed["job"], placed["node"]
    alloc = Allocation.objects.get(job=job)
    user = job.submitted_by

    async def scenario():
        resp = await _open(user, f"job={job.pk}")
        chunks = aiter(resp.streaming_content)
        await anext(chunks)
        await sync_to_async(job_log_append)(
            node=node, job_id=job.pk, attempt=alloc.attempt, seq=1, stream="stdout", text="hi\n"
        )
        got = await asyncio.wait_for(anext(chunks), timeout=10)
        assert _events(got) == ["logs"]
        sample = {"gpu_id": alloc.gpu_id, "utilization": 50.0, "memory_used_mib": 1000}
        await sync_to_async(ingest_samples)(node=node, samples=[sample], now=timezone.now())
        got = await asyncio.wait_for(anext(chunks), timeout=10)
        assert _events(got) == ["telemetry"]

    _run(scenario)


def test_an_array_page_hears_of_its_shards_and_their_logs_only(team, fleet, api):
    body = {"project": "alpha", "name": "farm", "command": "true", "gpu_model": "H100-80GB-SXM"}
    resp = api(team["member"]).post("/api/v1/jobs", {**body, "shard_count": 3}, format="json")
    assert resp.status_code == 201, resp.content
    root, middle, last = (s["id"] for s in resp.json())
    outside = _submit(api, team["member"])
    run_cycle()
    alloc = Allocation.objects.get(job_id=last)
    node, second = alloc.node, Job.objects.get(pk=middle)

    async def scenario():
        resp = await _open(team["member"], f"array={middle}")  # a shard names its array
        assert resp.status_code == 200
        chunks = aiter(resp.streaming_content)
        assert _events(await anext(chunks)) == ["ready"]
        await sync_to_async(job_cancel)(actor=team["member"], job=outside)  # not the array's
        await sync_to_async(job_cancel)(actor=team["member"], job=second)
        got = await asyncio.wait_for(anext(chunks), timeout=10)
        assert _events(got) == ["job"] and f'"ids":[{middle}]'.encode() in got
        await sync_to_async(job_log_append)(
            node=node, job_id=last, attempt=alloc.attempt, seq=1, stream="stdout", text="f\n"
        )
        got = await asyncio.wait_for(anext(chunks), timeout=10)
        assert _events(got) == ["logs"] and f'"job":{last}'.encode() in got  # whose log

    _run(scenario)
    assert root < middle < last


def test_the_stream_keeps_to_what_the_user_may_see(team, fleet, api, client):
    job = _submit(api, team["member"])

    async def scenario():
        assert (await _open(team["outsider"], f"job={job.pk}")).status_code == 404
        assert (await _open(team["outsider"], f"array={job.pk}")).status_code == 404
        assert (await _open(team["member"], "cluster=1")).status_code == 403
        assert (await _open(team["member"], f"node={fleet['nodes']['h1'].pk}")).status_code == 403
        assert (await _open(team["member"], "nothing=1")).status_code == 400
        assert (await AsyncClient().get(f"/events/?job={job.pk}")).status_code == 403

    _run(scenario)
    # A WSGI server cannot hold a stream without holding a worker: no push, the page polls.
    client.force_login(team["member"])
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # see _run: the view is async
        answer = pool.submit(client.get, f"/events/?job={job.pk}").result()
    assert answer.status_code == 204


def test_nothing_is_published_before_commit(team, fleet, api):
    job = _submit(api, team["member"])
    listener = redis.Redis.from_url(settings.REDIS_URL).pubsub()
    listener.subscribe(push.project_channel(team["a"].pk))
    assert listener.get_message(timeout=1)["type"] == "subscribe"
    with transaction.atomic():
        job_cancel(actor=team["member"], job=job)
        assert listener.get_message(timeout=0.3) is None  # a page would read the old state
    message = listener.get_message(timeout=5)
    assert message is not None and message["data"] == f'{{"k":"jobs","ids":[{job.pk}]}}'.encode()
    listener.close()


async def _watch(token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return await AsyncClient().get("/events/agent", headers=headers)


def test_an_agent_watch_hears_of_its_own_nodes_assignments_only(team, fleet, api):
    from scheduler.models import Node

    Node.objects.exclude(name="h1").update(state=Node.State.CORDONED)  # the job goes to h1

    async def scenario():
        resp = await _watch(fleet["tokens"]["h1"])
        assert resp.status_code == 200 and resp["Content-Type"] == "text/event-stream"
        chunks = aiter(resp.streaming_content)
        assert _events(await anext(chunks)) == ["ready"]
        other = await _watch(fleet["tokens"]["h2"])
        other_chunks = aiter(other.streaming_content)
        assert _events(await anext(other_chunks)) == ["ready"]
        await sync_to_async(_submit)(api, team["member"])
        assert len((await sync_to_async(run_cycle)()).placed) == 1
        got = await asyncio.wait_for(anext(chunks), timeout=10)
        assert _events(got) == ["assignments"]
        with pytest.raises(TimeoutError):  # h2's assignments did not change
            await asyncio.wait_for(anext(other_chunks), timeout=1)

    _run(scenario)


def test_an_agent_watch_needs_a_node_token_and_an_async_server(fleet, client):
    async def scenario():
        assert (await _watch(None)).status_code == 401
        assert (await _watch("gpuagent_not-a-token")).status_code == 401
        user_token = "gpc_" + "x" * 40  # a user's API token is not a node's
        assert (await _watch(user_token)).status_code == 401

    _run(scenario)
    # Under WSGI there is no stream to hold: 204, the agent polls.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # see _run: the view is async
        answer = pool.submit(
            client.get,
            "/events/agent",
            headers={"Authorization": f"Bearer {fleet['tokens']['h1']}"},
        ).result()
    assert answer.status_code == 204
