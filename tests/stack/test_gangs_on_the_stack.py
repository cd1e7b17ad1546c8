"""Gangs and elastic resizes on the running stack: live server, real Celery worker, node agents
as real processes (the process runtime: the job image has no PyTorch) on one host, each one a
simulated node that reaches the others at 127.0.0.1."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from portal.services import token_create
from scheduler.models import Allocation, Job, JobEvent, JobMember, JobState, LogChunk, Node
from tests.polling import wait_for
from tests.stack_fixtures import wait_for_registration

pytestmark = [pytest.mark.celery, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def stack(celery_live_worker, agents, team, fleet, settings):
    settings.AGENT_PORTAL_URL = agents.url
    Node.objects.filter(name="l1").update(state=Node.State.CORDONED)
    for name in ("h1", "h2"):
        agents.start(name, fleet["tokens"][name], "2xH100-80GB-SXM", AGENT_ADDRESS="127.0.0.1")
    wait_for_registration(["h1", "h2"])
    client = APIClient()
    client.credentials(
        HTTP_AUTHORIZATION=f"Bearer {token_create(user=team['member'], name='g').secret}"
    )
    return {"api": client, "agents": agents, **team, **fleet}


def submit(stack, **fields) -> int:
    body = {"project": "alpha", "name": "gang", "gpu_model": "H100-80GB-SXM", **fields}
    resp = stack["api"].post(f"{stack['agents'].url}/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return int(resp.json()["id"])


def state_of(job_id: int) -> str:
    return Job.objects.get(pk=job_id).state


def log_of(job_id: int, **where) -> str:
    return "".join(LogChunk.objects.filter(job_id=job_id, **where).values_list("text", flat=True))


ALL_REDUCE = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"rank {rank} of {world} node {os.environ['NODE_RANK']}: all_reduce {t.item():g}")
    dist.destroy_process_group()
    """
)


def test_torch_distributed_all_reduce_across_two_agents(stack, tmp_path: Path):
    """A real torch.distributed job (gloo on CPU), one member on each of two agents: the sum
    1 + 2 = 3 on both ranks proves they met through MASTER_ADDR:MASTER_PORT."""
    torch = pytest.importorskip(
        "torch", reason="PyTorch (CPU) is not installed: scripts/test.sh installs torch==2.13.0"
    )
    del torch
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    job_id = submit(
        stack,
        gpus=2,
        nodes=2,
        gpus_per_node=1,
        # the job's interpreter is this one (it has torch); the process runtime runs it
        command=f"{sys.executable} {script}",
        env={"GLOO_SOCKET_IFNAME": "lo"},
    )
    wait_for(lambda: state_of(job_id) in (JobState.SUCCEEDED, JobState.FAILED), timeout=120)
    assert state_of(job_id) == JobState.SUCCEEDED, log_of(job_id)
    lines = ("rank 0 of 2 node 0: all_reduce 3", "rank 1 of 2 node 1: all_reduce 3")
    # the members' log chunks are numbered apart: both reach the job's log
    wait_for(lambda: all(line in log_of(job_id) for line in lines), timeout=20)
    members = JobMember.objects.filter(job_id=job_id).order_by("rank")
    assert [(m.node.name != members[0].node.name or m.rank == 0, m.state) for m in members] == [
        (True, "succeeded"),
        (True, "succeeded"),
    ]


def test_torchrun_rendezvous_endpoint_works_from_the_members_environment(stack, tmp_path: Path):
    """Each member runs `torchrun` with the documented flags, from its environment alone
    (c10d rendezvous at rank 0's MASTER_ADDR:MASTER_PORT): the workers meet and all-reduce."""
    pytest.importorskip(
        "torch", reason="PyTorch (CPU) is not installed: scripts/test.sh installs torch==2.13.0"
    )
    script = tmp_path / "all_reduce.py"
    script.write_text(ALL_REDUCE)
    job_id = submit(
        stack,
        gpus=2,
        nodes=2,
        gpus_per_node=1,
        command=f"{sys.executable} -m torch.distributed.run --nnodes=$NNODES "
        "--nproc-per-node=$LOCAL_WORLD_SIZE --node-rank=$NODE_RANK --rdzv-backend=c10d "
        f"--rdzv-endpoint=$MASTER_ADDR:$MASTER_PORT {script}",
        env={"GLOO_SOCKET_IFNAME": "lo"},
    )
    wait_for(lambda: state_of(job_id) in (JobState.SUCCEEDED, JobState.FAILED), timeout=180)
    assert state_of(job_id) == JobState.SUCCEEDED, log_of(job_id)
    wait_for(lambda: log_of(job_id).count(": all_reduce 3") == 2, timeout=20)
    assert "of 2" in log_of(job_id)


def test_gang_member_failing_stops_the_other_and_bills_nothing_after(stack, tmp_path: Path):
    """A 2-member gang where rank 1 exits 1: rank 0 is stopped (SIGTERM), the job fails once,
    and no usage is metered past the stop."""
    from billing.models import UsageRecord
    from billing.services import usage_meter

    job_id = submit(
        stack,
        gpus=2,
        nodes=2,
        gpus_per_node=1,
        command='if [ "$RANK" = 1 ]; then sleep 2; echo rank 1 fails; exit 1; fi; '
        f"trap 'echo rank 0 got SIGTERM > {tmp_path}/stopped; exit 143' TERM; sleep 120 & wait",
    )
    wait_for(lambda: state_of(job_id) == JobState.FAILED, timeout=90)
    job = Job.objects.get(pk=job_id)
    assert "exit code 1" in job.failure_reason
    # its logs are closed once its GPUs are released: the trap leaves its mark in a file
    wait_for(lambda: (tmp_path / "stopped").exists(), timeout=30)
    states = dict(JobMember.objects.filter(job_id=job_id).values_list("rank", "state"))
    assert states == {0: "stopped", 1: "failed"}
    assert JobEvent.objects.filter(job_id=job_id, to_state=JobState.FAILED).count() == 1
    ends = set(Allocation.objects.filter(job_id=job_id).values_list("ended_at", flat=True))
    assert ends == {job.finished_at}  # both members' GPUs end at the stop
    usage_meter()
    slices = UsageRecord.objects.filter(job_id=job_id)
    assert slices.count() == 2 and all(s.slice_end <= job.finished_at for s in slices)


def test_elastic_eight_to_two_resumes_from_its_checkpoint(stack, tmp_path: Path):
    """The mission's case: a checkpointing training job on 8 GPUs is shrunk to 2 when other
    work arrives, resumes from its checkpoint at WORLD_SIZE 2, and finishes; usage has an
    8-GPU period and a 2-GPU one."""
    from billing.models import UsageRecord
    from billing.services import usage_meter
    from scheduler.nodes import node_issue_agent_token
    from scheduler.seed import node_register_simulated

    big = node_register_simulated(
        name="big",
        pool=stack["pool"],
        gpu_model=stack["h100"],
        gpu_count=8,
        cpu_milli=64_000,
        memory_mib=512_000,
        state="ready",
    )
    Node.objects.filter(name__in=["h1", "h2"]).update(state=Node.State.CORDONED)
    stack["agents"].start("big", node_issue_agent_token(node=big), "8xH100-80GB-SXM")
    wait_for_registration(["big"])
    from storage.models import Volume

    volume = Volume.objects.create(project=stack["a"], name="ckpt", kind="shared", size_gib=1)
    ckpt = stack["agents"].shared_root / f"v{volume.pk}" / "train"
    train = submit(
        stack,
        name="train",
        gpus=8,
        elastic_min=2,
        elastic_max=8,
        checkpoint="ckpt:train",
        command="echo world size $WORLD_SIZE resume $RESUME; "
        "python3 -m agent.workload --seconds 16 --step-seconds 0.2 --checkpoint-every 1",
    )
    wait_for(lambda: state_of(train) == JobState.RUNNING, timeout=60)
    wait_for(lambda: (ckpt / "checkpoint.json").exists(), timeout=30)
    other = submit(stack, name="other", gpus=6, command="sleep 2")
    wait_for(lambda: state_of(other) == JobState.SUCCEEDED, timeout=90)
    wait_for(lambda: state_of(train) == JobState.SUCCEEDED, timeout=90)

    job = Job.objects.get(pk=train)
    assert job.gpus == 2 and job.attempt == 2
    first, second = log_of(train, attempt=1), log_of(train, attempt=2)
    assert "world size 8 resume 0" in first and "SIGTERM: checkpoint saved at step" in first
    saved = int(first.split("SIGTERM: checkpoint saved at step ")[1].split(";")[0])
    assert saved > 0
    assert "world size 2 resume 1" in second
    assert f"resumed from checkpoint at step {saved}" in second and "done:" in second
    resize = JobEvent.objects.get(job_id=train, to_state=JobState.PREEMPTING)
    assert resize.data["resize"]["to"] == 2 and resize.data["resize"]["for_job"] == other

    usage_meter()
    periods: dict[int, set[int]] = {}
    for attempt, alloc in UsageRecord.objects.filter(job_id=train).values_list(
        "allocation__attempt", "allocation_id"
    ):
        periods.setdefault(attempt, set()).add(alloc)
    assert {a: len(ids) for a, ids in periods.items()} == {1: 8, 2: 2}
    # the invoice shows both periods: one attempt on 8 GPUs, the next on 2
    from datetime import UTC, datetime, timedelta

    from billing import selectors as billing_selectors
    from billing import services as billing_services

    month = job.finished_at.date().replace(day=1)
    after = (month + timedelta(days=32)).replace(day=1)
    account = billing_services.account_open_for_project(project=job.project)
    invoice = billing_services.invoice_close(
        account_id=account.pk,
        period_start=month,
        now=datetime(after.year, after.month, 1, 0, 30, tzinfo=UTC),
    )
    (row,) = [
        r for r in billing_selectors.invoice_job_summary(invoice=invoice) if r["job_id"] == train
    ]
    assert [p["gpus"] for p in row["periods"]] == [8, 2]
