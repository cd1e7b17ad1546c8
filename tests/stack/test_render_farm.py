"""The distributed render on the running stack: an array job's shards render frames on real
agents, a dependent job merges them; one shard's node dies mid-way and only that shard reruns."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from portal.services import token_create
from scheduler.models import Allocation, Job, JobState, LogChunk, Node
from tests.polling import wait_for
from tests.stack import render_farm
from tests.stack_fixtures import wait_for_registration

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]

FRAMES, SHARDS = 12, 3


@pytest.fixture
def farm(celery_live_worker, agents, team, fleet, settings):
    settings.AGENT_PORTAL_URL = agents.url
    settings.NODE_LOST_AFTER_SECONDS = 3
    for name in ("h1", "h2"):
        agents.start(name, fleet["tokens"][name], "2xH100-80GB-SXM")
    wait_for_registration(["h1", "h2"])
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {token_create(user=team['member'], name='farm').secret}"
    )
    # The shared output directory every node writes to (jobs run as their own uids).
    out = Path(tempfile.mkdtemp(prefix="render-"))
    out.chmod(0o777)
    script = out / "render_farm.py"
    shutil.copy(render_farm.__file__, script)
    script.chmod(0o644)
    try:
        yield {"api": client, "url": agents.url, "agents": agents, "out": out, "script": script}
    finally:
        shutil.rmtree(out, ignore_errors=True)


def submit(farm, **fields) -> list[dict]:
    body = {"project": "alpha", "gpu_model": "H100-80GB-SXM", **fields}
    resp = farm["api"].post(f"{farm['url']}/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    data = resp.json()
    return data if isinstance(data, list) else [data]


def node_of(job_id: int) -> str | None:
    a = Allocation.objects.filter(job_id=job_id, ended_at__isnull=True).select_related("node")
    first = a.first()
    return first.node.name if first else None


def test_render_farm_reruns_only_the_shard_whose_node_died(farm):
    out, script = farm["out"], farm["script"]
    shards = submit(
        farm,
        name="render",
        shard_count=SHARDS,
        gpus=2,  # a whole node each: a node's loss takes exactly one shard
        max_restarts=1,
        command=f"python3 {script} render {out} --frames {FRAMES} --pause 1",
    )
    ids = [s["id"] for s in shards]
    (merge,) = submit(
        farm,
        name="merge",
        gpus=1,
        command=f"python3 {script} merge {out} --frames {FRAMES}",
        dependencies=[{"type": "after_ok", "job": ids[0]}],
    )
    assert merge["pending"]["message"] == (
        f"waiting for array {ids[0]} to succeed (0 of {SHARDS} shards done)"
    )

    # Two shards run, one per node; the one on h2 has rendered a frame when h2 dies.
    wait_for(lambda: any(node_of(i) == "h2" for i in ids), timeout=60)
    victim = next(i for i in ids if node_of(i) == "h2")
    shard = Job.objects.get(pk=victim).shard_index
    wait_for(lambda: (out / render_farm.frame_name(shard)).exists(), timeout=60)
    assert Job.objects.get(pk=victim).state == JobState.RUNNING
    pid = int((out / f"shard-{shard}.pid").read_text())
    farm["agents"].stop("h2", kill=True)  # the node dies: its agent and the work on it
    os.killpg(os.getpgid(pid), signal.SIGKILL)

    from scheduler.nodes import lost_nodes_sweep

    def h2_lost() -> bool:
        lost_nodes_sweep()  # beat's health sweep
        return Node.objects.get(name="h2").state == Node.State.LOST

    wait_for(h2_lost, timeout=30)
    wait_for(lambda: Job.objects.get(pk=merge["id"]).is_terminal, timeout=120, interval=0.5)

    merged = Job.objects.get(pk=merge["id"])
    assert merged.state == JobState.SUCCEEDED, merged.failure_reason
    jobs = {j.pk: j for j in Job.objects.filter(pk__in=ids)}
    assert all(j.state == JobState.SUCCEEDED for j in jobs.values())
    # Only the shard on the dead node ran twice; the others ran once, untouched.
    assert jobs[victim].attempt == 2 and jobs[victim].restarts == 1
    assert "lost" in jobs[victim].events.values_list("to_state", flat=True)
    for pk, job in jobs.items():
        if pk != victim:
            assert job.attempt == 1, f"shard {job.shard_index} ran {job.attempt} times"
            assert "lost" not in job.events.values_list("to_state", flat=True)
    rerun = "".join(
        LogChunk.objects.filter(job_id=victim, attempt=2).values_list("text", flat=True)
    )
    assert f"shard {shard}: frame {shard} done" in rerun
    # The merge started after the last shard ended, and its sheet is every frame, in order.
    last_shard_end = max(j.finished_at for j in jobs.values())
    assert merged.started_at is not None and merged.started_at >= last_shard_end
    expected = render_farm.contact_sheet([render_farm.frame_pixels(i) for i in range(FRAMES)])
    assert (out / "sheet.ppm").read_bytes() == expected
    array = farm["api"].get(f"{farm['url']}/api/v1/jobs/{ids[0]}/array").json()
    assert array["by_state"] == {"succeeded": SHARDS}
