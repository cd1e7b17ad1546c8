"""Slurm-backed pools against a real (throwaway) Slurm cluster: submit, states and reasons,
gangs, arrays, cancel, time limits, QOS preemption, drain, accounting into the ledger, limits."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from billing.models import Invoice, UsageRecord
from billing.slurm import meter_day
from portal.models import AuditEvent
from scheduler.backends.slurm.accounts import account_limits, ensure_account
from scheduler.backends.slurm.models import SlurmJob
from scheduler.cycle import run_cycle
from scheduler.models import Allocation, Job, JobEvent, JobState, Node, NodeEvent, Quota
from tests import polling
from tests.slurm.conftest import cluster, slurm

pytestmark = pytest.mark.django_db

S = JobState


def submit(api, user, **fields):
    body = {
        "project": "alpha",
        "name": "train",
        "command": "echo hello from $JOB_ID; sleep 1",
        "pool": "hpc",
        "gpu_model": "A100-80GB",
        "gpus": 1,
        "time_limit_s": 600,
        **fields,
    }
    resp = api(user).post("/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    body = resp.json()
    return Job.objects.get(pk=(body[0] if isinstance(body, list) else body)["id"])


def handed_over(job: Job) -> SlurmJob:
    run_cycle()  # the cycle's hand-off: sbatch
    job.refresh_from_db()
    return SlurmJob.objects.get(job=job)


def squeue_field(slurm_id: str, fmt: str) -> str:
    return slurm("squeue", "-h", "-j", slurm_id, "-o", fmt).strip()


def test_submit_from_the_api_runs_in_slurm_with_logs(slurm_pool, team, api, wait_for):
    job = submit(api, team["member"], gpus=2, cpu_milli=2000, memory_mib=2048)
    assert job.state == S.QUEUED
    link = handed_over(job)
    assert link.slurm_job_id.isdigit()
    # Slurm holds what we asked for
    tres = slurm("scontrol", "show", "job", link.slurm_job_id)
    assert "gres/gpu:a100=2" in tres and "Account=alpha" in tres and "QOS=normal" in tres
    assert "TimeLimit=00:10:00" in tres
    sbatch = JobEvent.objects.get(job=job, data__slurm_job_id=link.slurm_job_id)
    assert "--gres=gpu:a100:2" in sbatch.data["sbatch"]
    # the portal sees it run on two mirrored A100s, then succeed
    job = wait_for(job, lambda j: j.state in (S.RUNNING, S.SUCCEEDED))
    assert Allocation.objects.filter(job=job).count() == 2
    assert {a.gpu.node.name for a in Allocation.objects.filter(job=job)} <= {
        "hpc.gpu-a",
        "hpc.gpu-b",
    }
    job = wait_for(job, lambda j: j.state == S.SUCCEEDED)
    assert job.exit_code == 0
    assert not Allocation.objects.filter(job=job, ended_at__isnull=True).exists()
    logs = api(team["member"]).get(f"/api/v1/jobs/{job.pk}/logs").json()
    assert f"hello from {job.pk}" in logs["text"]
    assert logs["last"] > 0
    again = api(team["member"]).get(f"/api/v1/jobs/{job.pk}/logs?after={logs['last']}").json()
    assert again["text"] == ""


def test_submit_from_the_form(slurm_pool, team, client, wait_for):
    client.force_login(team["member"])
    resp = client.post(
        "/jobs/new/",
        {
            "project": "alpha",
            "name": "form-job",
            "command": "echo from the form",
            "gpu_model": "A100-80GB",
            "pool": "hpc",
            "shape": "whole",
            "gpus": "1",
            "priority": "1",
            "shard_count": "1",
            "max_restarts": "0",
        },
    )
    assert resp.status_code == 302, resp.content.decode()[:2000]
    job = Job.objects.get(name="form-job")
    assert job.pool == slurm_pool and job.source == Job.Source.FORM
    link = handed_over(job)
    wait_for(job, lambda j: j.state == S.SUCCEEDED)
    assert "from the form" in Path(link.output_path).read_text()
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "Slurm" in page


def test_two_node_gang_and_the_pending_reason_in_words(slurm_pool, team, api, wait_for):
    gang = submit(api, team["member"], nodes=2, gpus_per_node=4, gpus=1, command="sleep 30")
    link = handed_over(gang)
    gang = wait_for(gang, lambda j: j.state == S.RUNNING)
    nodes = {a.node.name for a in Allocation.objects.filter(job=gang, ended_at__isnull=True)}
    assert nodes == {"hpc.gpu-a", "hpc.gpu-b"}
    assert Allocation.objects.filter(job=gang, ended_at__isnull=True).count() == 8
    assert squeue_field(link.slurm_job_id, "%D") == "2"
    # every GPU is taken: the next job waits, and says why in words
    waiting = submit(api, team["member"], gpus=1)
    handed_over(waiting)
    waiting = wait_for(waiting, lambda j: "Resources" in j.pending_message)
    assert waiting.state == S.QUEUED
    assert waiting.pending_message.startswith("waiting: Resources — the GPUs it asks for")
    body = api(team["member"]).get(f"/api/v1/jobs/{waiting.pk}").json()
    assert "waiting: Resources" in str(body["pending"])
    # ops: the mirrored nodes show what Slurm says
    a = Node.objects.get(name="hpc.gpu-a")
    from scheduler.backends.slurm.nodes import sync_nodes

    sync_nodes(slurm_pool)
    a.refresh_from_db()
    # all its GPUs are taken (its CPUs are not all: Slurm says mixed, or allocated)
    assert a.labels["slurm_state"] in ("mixed", "allocated") and a.labels["gpus_alloc"] == 4


def test_array_runs_as_a_slurm_array(slurm_pool, team, api, wait_for):
    first = submit(
        api, team["member"], shard_count=3, command="echo shard $SHARD_INDEX of $SHARD_COUNT"
    )
    shards = list(Job.objects.filter(pk=first.pk) | Job.objects.filter(array_parent=first))
    assert len(shards) == 3
    handed_over(first)
    links = {link.job.shard_index: link for link in SlurmJob.objects.filter(job__in=shards)}
    array_id = links[0].slurm_job_id.split("_")[0]
    assert {i: link.slurm_job_id for i, link in links.items()} == {
        i: f"{array_id}_{i}" for i in range(3)
    }
    for shard in shards:
        wait_for(shard, lambda j: j.state == S.SUCCEEDED)
    for i, link in links.items():
        assert Path(link.output_path).read_text().strip() == f"shard {i} of 3"


def test_cancel_is_scancel(slurm_pool, team, api, wait_for, django_capture_on_commit_callbacks):
    job = submit(api, team["member"], command="sleep 60")
    link = handed_over(job)
    wait_for(job, lambda j: j.state == S.RUNNING)
    with django_capture_on_commit_callbacks(execute=True):
        resp = api(team["member"]).post(f"/api/v1/jobs/{job.pk}/cancel")
    assert resp.status_code == 200 and resp.json()["state"] == "cancelled"
    deadline = time.monotonic() + 15
    while squeue_field(link.slurm_job_id, "%T") not in ("", "CANCELLED"):
        assert time.monotonic() < deadline, squeue_field(link.slurm_job_id, "%T")
        time.sleep(0.2)
    state = slurm("sacct", "-n", "-X", "-j", link.slurm_job_id, "-o", "State%30").strip()
    assert state.startswith("CANCELLED")
    job.refresh_from_db()
    assert job.state == S.CANCELLED
    assert not Allocation.objects.filter(job=job, ended_at__isnull=True).exists()


def test_time_limit_hit_is_a_timeout(slurm_pool, team, api, wait_for):
    # the shortest limit the API takes (a minute: Slurm's own granularity too)
    job = submit(api, team["member"], command="sleep 300", time_limit_s=60)
    link = handed_over(job)
    assert "TimeLimit=00:01:00" in slurm("scontrol", "show", "job", link.slurm_job_id)
    # slurmctld checks time limits every 30 s: the job ends 60-90 s after it started
    job = wait_for(job, lambda j: j.is_terminal, timeout=120)
    assert job.state == S.FAILED
    assert job.failure_reason.startswith("timeout")


def test_qos_preemption_requeues_the_preemptible_job(slurm_pool, team, api, wait_for):
    low = [
        submit(api, team["member"], gpus=4, preemptible=True, command="sleep 120") for _ in range(2)
    ]
    links = [handed_over(j) for j in low]
    assert "QOS=scavenger" in slurm("scontrol", "show", "job", links[0].slurm_job_id)
    for j in low:
        wait_for(j, lambda x: x.state == S.RUNNING)
    urgent = submit(api, team["member"], gpus=4, command="sleep 30", priority="normal")
    handed_over(urgent)
    wait_for(urgent, lambda j: j.state == S.RUNNING, timeout=60)
    requeued = []
    for j in low:
        wait_for(j, lambda x: x.state in (S.RUNNING, S.QUEUED))
        if j.state == S.QUEUED:
            requeued.append(j)
    assert len(requeued) == 1
    victim = requeued[0]
    assert "preempted and requeued" in victim.pending_message
    assert victim.slurm.restarts == 1
    ended = Allocation.objects.filter(job=victim, attempt=1)
    assert ended.count() == 4 and all(a.end_reason == "preempted" for a in ended)
    assert JobEvent.objects.filter(job=victim, from_state=S.RUNNING, to_state=S.QUEUED).exists()


def test_drain_and_resume_from_the_ops_page(slurm_pool, make_user, client):
    operator = make_user(staff=True)
    client.force_login(operator)
    node = Node.objects.get(name="hpc.gpu-b")
    page = client.get(f"/ops/nodes/{node.pk}/").content.decode()
    assert 'data-testid="slurm-node"' in page and "Drain" in page
    listing = client.get("/ops/nodes/").content.decode()
    assert "hpc.gpu-b" in listing and "Slurm idle" in listing
    resp = client.post(
        f"/ops/nodes/{node.pk}/slurm/drain/",
        {"confirm": node.name, "reason": "fan noise in rack 4"},
    )
    assert resp.status_code == 302
    shown = slurm("scontrol", "show", "node", "gpu-b")
    assert "DRAIN" in shown
    assert f"fan noise in rack 4 (by {operator.email} via the portal)" in shown
    node.refresh_from_db()
    assert node.state == Node.State.CORDONED and "drain" in node.labels["slurm_state"]
    assert NodeEvent.objects.filter(node=node, kind="slurm_drain").exists()
    audit = AuditEvent.objects.get(action="node.slurm_drain")
    assert audit.actor == operator and audit.data["reason"] == "fan noise in rack 4"
    # no reason, no drain (Slurm needs one): a message, not a 500
    resp = client.post(
        f"/ops/nodes/{node.pk}/slurm/drain/", {"confirm": node.name, "reason": " "}, follow=True
    )
    assert "Say why" in resp.content.decode()
    client.post(f"/ops/nodes/{node.pk}/slurm/resume/", {"confirm": node.name})
    assert "DRAIN" not in slurm("scontrol", "show", "node", "gpu-b").split("Reason")[0]
    node.refresh_from_db()
    assert node.state == Node.State.READY
    # a member cannot
    pools = client.get("/ops/pools/").content.decode()
    assert "Slurm cluster" in pools and "gres/gpu:a100" in pools


def test_usage_from_sacct_on_the_ledger_and_remetering_is_idempotent(
    slurm_pool, team, api, wait_for
):
    job = submit(api, team["member"], gpus=2, command="sleep 3")
    handed_over(job)
    job = wait_for(job, lambda j: j.state == S.SUCCEEDED)
    # sacct's own times; the ledger reads them, not when the portal noticed
    today = job.finished_at.date()
    # slurmdbd can record the job a moment after slurmctld reports it ended (seen under load):
    # the ledger reads only what accounting holds, so meter until the record is there
    polling.wait_for(lambda: (r := meter_day(slurm_pool, today)).ours >= 1 and r, 30, 1)
    records = UsageRecord.objects.filter(job=job)
    assert records.exists()
    seconds = {r.allocation_id: 0 for r in records}
    for r in records:
        seconds[r.allocation_id] += r.seconds
    assert len(seconds) == 2  # two GPUs
    assert all(3 <= s <= 6 for s in seconds.values()), seconds
    assert {r.gpu_model.name for r in records} == {"A100-80GB"}
    invoice = Invoice.objects.filter(usage_records__job=job).distinct().get()
    assert invoice.usage_records.filter(job=job).count() == records.count()
    total = sum(r.amount for r in records)
    assert total > 0
    snapshot = sorted(records.values_list("allocation_id", "slice_start", "seconds", "amount"))
    again = meter_day(slurm_pool, today)
    assert again.allocations_created == 0 and again.allocations_updated == 0
    assert again.meter.records == 0
    assert sorted(records.values_list("allocation_id", "slice_start", "seconds", "amount")) == (
        snapshot
    )


def test_quota_becomes_a_slurm_limit_and_its_reason_shows(
    slurm_pool, team, api, wait_for, django_capture_on_commit_callbacks
):
    project = team["a"]
    Quota.objects.filter(project=project).update(
        max_gpus=2, max_gpus_per_job=3, allow_borrowing=False
    )  # no signal
    ensure_account(slurm_pool.slurm, project)
    assert account_limits(cluster(), "alpha").startswith("gres/gpu=2")
    assert account_limits(cluster(), "alpha", "maxtres") == "gres/gpu=3"
    # a job bigger than the quota's GPUs per job, submitted to Slurm directly, waits there
    too_big = slurm(
        "sbatch", "--parsable", "-A", "alpha", "--gres=gpu:a100:4", "-o", "/dev/null",
        "--wrap", "true",
    ).strip()  # fmt: skip
    deadline = time.monotonic() + 15
    while squeue_field(too_big, "%r") != "AssocMaxGRESPerJob":
        assert time.monotonic() < deadline, squeue_field(too_big, "%T %r")
        time.sleep(0.2)
    slurm("scancel", too_big)
    # work submitted to Slurm directly, under the project's account, holds the two GPUs
    direct = slurm(
        "sbatch",
        "--parsable",
        "-A",
        "alpha",
        "--gres=gpu:a100:2",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 60",
    ).strip()
    deadline = time.monotonic() + 15
    while squeue_field(direct, "%T") != "RUNNING":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # the portal admits (it does not see that work); Slurm's limit holds it, and says so
    job = submit(api, team["member"], gpus=2)
    assert job.state == S.QUEUED
    handed_over(job)
    job = wait_for(job, lambda j: "AssocGrpGRES" in j.pending_message)
    assert "the project's GPU limit in Slurm is reached" in job.pending_message
    # a quota edit reaches Slurm (after commit, through a task)
    from config.celery import app

    quota = Quota.objects.get(project=project)
    quota.max_gpus, quota.max_gpus_per_job = 6, 4
    app.conf.task_always_eager = True  # the task runs here, no worker in this test
    try:
        with django_capture_on_commit_callbacks(execute=True):
            quota.save()
    finally:
        app.conf.task_always_eager = False
    assert account_limits(cluster(), "alpha").startswith("gres/gpu=6")
    assert account_limits(cluster(), "alpha", "maxtres") == "gres/gpu=4"
    # and the portal's own admission still answers first
    too_many = api(team["member"]).post(
        "/api/v1/jobs",
        {
            "project": "alpha",
            "name": "x",
            "command": "true",
            "pool": "hpc",
            "gpu_model": "A100-80GB",
            "gpus": 7,
        },
        format="json",
    )
    assert too_many.status_code == 201 and too_many.json()["state"] == "rejected"


def test_dry_run_is_slurms_answer(slurm_pool, team, api):
    ok = api(team["member"]).post(
        "/api/v1/jobs/dry-run",
        {
            "project": "alpha",
            "name": "x",
            "command": "true",
            "pool": "hpc",
            "gpu_model": "A100-80GB",
            "gpus": 2,
        },
        format="json",
    )
    assert ok.status_code == 200, ok.content
    body = ok.json()
    assert body["answered_by"] == "slurm"
    assert body["wait_message"].startswith("Slurm's answer (sbatch --test-only)")
    assert "gpu-a" in body["wait_message"] or "gpu-b" in body["wait_message"]
    assert body["would_start_now"] is True
    # nothing was submitted
    assert slurm("squeue", "-h").strip() == ""
    never = api(team["member"]).post(
        "/api/v1/jobs/dry-run",
        {
            "project": "alpha",
            "name": "x",
            "command": "true",
            "pool": "hpc",
            "gpu_model": "A100-80GB",
            "nodes": 3,
            "gpus_per_node": 2,
        },
        format="json",
    )
    assert never.status_code == 200
    assert "it would refuse" in never.json()["wait_message"], never.json()


def test_submission_slurm_refuses_fails_with_slurms_words(slurm_pool, team, api):
    job = submit(api, team["member"], gpus=1, gpu_milli=500, gpu_memory_mib=1000)
    run_cycle()
    job.refresh_from_db()
    assert job.state == S.FAILED
    assert job.failure_reason.startswith("Slurm refused the job: Slurm pools take whole GPUs")
    assert os.path.isdir(os.environ["PORTAL_TEST_SLURM_SHARED"])


def test_an_array_with_a_dependent_merge_uses_slurms_own_dependency(
    slurm_pool, team, api, wait_for
):
    tag = f"r{time.monotonic_ns()}"
    first = submit(
        api,
        team["member"],
        name="render",
        shard_count=3,
        command=f"sleep 2; echo frame-$SHARD_INDEX > {tag}-$SHARD_INDEX.part",
    )
    merge = submit(
        api,
        team["member"],
        name="merge",
        command=f"cat {tag}-0.part {tag}-1.part {tag}-2.part",
        dependencies=[{"type": "after_ok", "job": first.pk}],
    )
    array_id = handed_over(first).slurm_job_id.split("_")[0]
    link = handed_over(merge)  # the array is in Slurm now: the merge goes with its dependency
    sbatch = JobEvent.objects.get(job=merge, data__slurm_job_id=link.slurm_job_id)
    assert f"--dependency=afterok:{array_id}" in sbatch.data["sbatch"]
    assert f"afterok:{array_id}_*" in slurm("scontrol", "show", "job", link.slurm_job_id)
    merge = wait_for(merge, lambda j: "Dependency" in j.pending_message)
    assert merge.state == S.QUEUED
    assert merge.pending_message.startswith("waiting: Dependency — waiting for the jobs it")
    # Slurm itself starts it once every task succeeded
    merge = wait_for(merge, lambda j: j.state == S.SUCCEEDED, timeout=60)
    assert Path(link.output_path).read_text().split() == ["frame-0", "frame-1", "frame-2"]


def test_a_failed_shard_fails_the_slurm_merge_and_scancels_it(slurm_pool, team, api, wait_for):
    first = submit(api, team["member"], name="render", shard_count=2, command='exit "$SHARD_INDEX"')
    merge = submit(
        api,
        team["member"],
        name="merge",
        command="echo merged",
        dependencies=[{"type": "after_ok", "job": first.pk}],
    )
    handed_over(first)
    link = handed_over(merge)

    def failed(job: Job) -> bool:
        run_cycle()
        job.refresh_from_db()
        return job.state == S.FAILED

    merge = wait_for(merge, failed, timeout=60)
    shard = Job.objects.get(array_parent=first, shard_index=1)
    assert merge.failure_reason == (
        f"dependency can no longer be met: array {first.pk}: shard 1 (job {shard.pk}) failed"
    )
    deadline = time.monotonic() + 20  # scancel'ed: Slurm no longer holds it
    while squeue_field(link.slurm_job_id, "%T") and time.monotonic() < deadline:
        time.sleep(0.3)
    assert squeue_field(link.slurm_job_id, "%T") == ""


def _finished_in_slurm(links: list[SlurmJob], timeout: float = 60) -> None:
    """Until sacct (what a pass reads for jobs gone from the queue) has every job completed."""
    ids = ",".join(link.slurm_job_id for link in links)
    deadline = time.monotonic() + timeout
    while True:
        states = slurm("sacct", "-n", "-X", "-P", "-j", ids, "-o", "State").split()
        if len(states) == len(links) and set(states) == {"COMPLETED"}:
            return
        assert time.monotonic() < deadline, states
        time.sleep(0.3)


def test_a_burst_of_slurm_changes_is_one_pass_of_bulk_statements(slurm_pool, team, api):
    """A pass that meets many changed jobs applies them together: the statements it runs do not
    grow with the number of jobs (issue 17: each change was its own ~20-statement transaction,
    so a burst of hundreds kept the portal 30-50 s behind Slurm)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from scheduler.backends.slurm.sync import sync_pool

    statements = {}
    for count in (2, 6):
        jobs = [submit(api, team["member"], command="true") for _ in range(count)]
        run_cycle()  # the hand-off: sbatch for each
        links = list(SlurmJob.objects.filter(job__in=jobs))
        assert len(links) == count
        _finished_in_slurm(links)
        with CaptureQueriesContext(connection) as queries:
            sync_pool(slurm_pool)  # the portal has not seen them run: queued → succeeded
        statements[count] = [q["sql"] for q in queries.captured_queries]
        for job in jobs:
            job.refresh_from_db()
            assert job.state == S.SUCCEEDED, (job.pk, job.state, job.pending_message)
            assert job.exit_code == 0 and job.finished_at is not None
            moves = [(e.from_state, e.to_state) for e in job.events.order_by("pk")]
            assert [m for m in moves if m[0] != m[1]][-3:] == [
                (S.PENDING, S.QUEUED),  # the submit
                (S.QUEUED, S.SCHEDULED),  # with the GPUs Slurm gave it
                (S.SCHEDULED, S.SUCCEEDED),
            ]
            (alloc,) = Allocation.objects.filter(job=job)
            # Slurm's own start and end times, not the moment the pass noticed
            assert alloc.started_at <= alloc.ended_at < job.finished_at
            assert alloc.end_reason == Allocation.EndReason.COMPLETED
    assert len(statements[6]) == len(statements[2]), "\n".join(statements[6])


def test_a_slurm_job_reaches_its_volumes_and_checkpoint_on_the_shared_filesystem(
    slurm_pool, team, api, wait_for
):
    """A volume is <storage_root>/v<id> on the cluster's filesystem: the job gets it as
    VOLUME_<NAME>, its checkpoint as CHECKPOINT_DIR inside it, and starts in its working dir."""
    from storage.models import Volume

    root = Path(os.environ["PORTAL_TEST_SLURM_SHARED"]) / "volumes"
    root.mkdir(mode=0o755, exist_ok=True)
    slurm_pool.slurm.storage_root = str(root)
    slurm_pool.slurm.save(update_fields=["storage_root"])
    ckpt = Volume.objects.create(project=team["a"], name="ckpt", kind="shared", size_gib=1)
    (root / f"v{ckpt.pk}").mkdir(mode=0o777)
    job = submit(
        api,
        team["member"],
        checkpoint="ckpt:runs/a",
        working_dir="/data/ckpt/runs",
        command='echo step 3 > "$CHECKPOINT_DIR/checkpoint.txt"; pwd; echo "v=$VOLUME_CKPT"',
    )
    handed_over(job)
    job = wait_for(job, lambda j: j.state in (S.SUCCEEDED, S.FAILED))
    text = api(team["member"]).get(f"/api/v1/jobs/{job.pk}/logs").json()["text"]
    assert job.state == S.SUCCEEDED, text
    assert (root / f"v{ckpt.pk}" / "runs" / "a" / "checkpoint.txt").read_text() == "step 3\n"
    assert f"{root}/v{ckpt.pk}/runs" in text and f"v={root}/v{ckpt.pk}" in text
