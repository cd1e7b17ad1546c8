"""Slurm's words → ours, and our jobs → sbatch: the tables, one row at a time (no cluster)."""

from __future__ import annotations

import pytest

from billing.slurm import parse_sacct
from portal.models import Project
from scheduler.backends.slurm.models import SlurmPool
from scheduler.backends.slurm.nodes import hostlist, our_state, parse_gres, parse_indexes
from scheduler.backends.slurm.submit import batch_job
from scheduler.backends.slurm.sync import REASONS, STATES, _expand, path, translate
from scheduler.models import GpuModel, Job, Node, Pool
from scheduler.models import JobState as S
from scheduler.transitions import can_transition


@pytest.mark.parametrize(
    ("state", "reason", "restarts", "exit_code", "ours", "words"),
    [
        ("PENDING", "Resources", 0, None, S.QUEUED, "waiting: Resources — the GPUs it asks for"),
        ("PENDING", "Priority", 0, None, S.QUEUED, "waiting: Priority — jobs of higher priority"),
        (
            "PENDING",
            "QOSMaxGRESPerUser",
            0,
            None,
            S.QUEUED,
            "waiting: QOSMaxGRESPerUser — the QOS's GPU limit per user is reached",
        ),
        ("PENDING", "AssocGrpGRES", 0, None, S.QUEUED, "the project's GPU limit in Slurm"),
        ("PENDING", "SomethingNew", 0, None, S.QUEUED, "waiting: SomethingNew — SomethingNew"),
        ("PENDING", "BeginTime", 1, None, S.QUEUED, "preempted and requeued (restart 1)"),
        ("REQUEUED", "", 0, None, S.QUEUED, "preempted and requeued"),
        ("CONFIGURING", "", 0, None, S.STARTING, "starting"),
        ("RUNNING", "None", 0, None, S.RUNNING, ""),
        ("COMPLETING", "", 0, None, S.RUNNING, "completing"),
        ("COMPLETED", "None", 0, 0, S.SUCCEEDED, ""),
        ("FAILED", "NonZeroExitCode", 0, 3, S.FAILED, "failed: exit code 3"),
        ("TIMEOUT", "TimeLimit", 0, None, S.FAILED, "timeout: it ran into its time limit"),
        ("OUT_OF_MEMORY", "OutOfMemory", 0, None, S.FAILED, "out of memory"),
        ("NODE_FAIL", "", 0, None, S.FAILED, "node failure"),
        ("BOOT_FAIL", "", 0, None, S.FAILED, "node failure"),
        ("CANCELLED", "None", 0, None, S.CANCELLED, "cancelled in Slurm"),
        ("CANCELLED by 0", "None", 0, None, S.CANCELLED, "cancelled in Slurm"),
        ("PREEMPTED", "", 0, None, S.FAILED, "preempted by Slurm (not requeued)"),
        ("SUSPENDED", "", 0, None, S.PREEMPTING, "suspended"),
    ],
)
def test_translate(state, reason, restarts, exit_code, ours, words):
    t = translate(state, reason, restarts=restarts, exit_code=exit_code)
    assert t.state == ours
    assert words in t.words if words else t.words == ""


def test_every_slurm_state_lands_in_one_of_ours():
    assert {ours for ours, _ in STATES.values()} <= set(S.values)
    assert all(REASONS.values())


@pytest.mark.parametrize(
    ("current", "target", "steps"),
    [
        (S.QUEUED, S.RUNNING, [S.SCHEDULED, S.RUNNING]),
        (S.QUEUED, S.SUCCEEDED, [S.SCHEDULED, S.SUCCEEDED]),
        (S.QUEUED, S.FAILED, [S.FAILED]),
        (S.RUNNING, S.QUEUED, [S.QUEUED]),
        (S.SCHEDULED, S.QUEUED, [S.PREEMPTING, S.QUEUED]),
        (S.RUNNING, S.RUNNING, []),
        (S.SUCCEEDED, S.RUNNING, []),  # terminal: no way out
    ],
)
def test_path_follows_the_transition_table(current, target, steps):
    got = path(current, target)
    assert got == steps
    here = current
    for to in got:
        assert can_transition(here, to)
        here = to


@pytest.mark.parametrize(
    ("gres", "parsed"),
    [
        ("gpu:a100:4", [("a100", 4)]),
        ("gpu:a100:4(S:0),gpu:h100:2", [("a100", 4), ("h100", 2)]),
        ("gpu:2", [("", 2)]),
        ("", []),
        ("(null)", []),
    ],
)
def test_parse_gres(gres, parsed):
    assert parse_gres(gres) == parsed


@pytest.mark.parametrize(
    ("detail", "idx"),
    [("gpu:a100:2(IDX:0-1)", [0, 1]), ("gpu:a100:3(IDX:0,2-3)", [0, 2, 3]), ("gpu:a100:0", [])],
)
def test_parse_indexes(detail, idx):
    assert parse_indexes(detail) == idx


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("gpu-a", ["gpu-a"]),
        ("gpu-[a-b]", ["gpu-a", "gpu-b"]),
        ("n[01-03],x", ["n01", "n02", "n03", "x"]),
        ("", []),
    ],
)
def test_hostlist(text, names):
    assert hostlist(text) == names


@pytest.mark.parametrize(
    ("state", "flags", "ours"),
    [
        ("idle", [], Node.State.READY),
        ("mixed", [], Node.State.READY),
        ("allocated", [], Node.State.READY),
        ("idle", ["DRAIN"], Node.State.CORDONED),
        ("mixed", ["DRAIN"], Node.State.DRAINING),
        ("down", [], Node.State.UNHEALTHY),
    ],
)
def test_node_states(state, flags, ours):
    assert our_state(state, flags) == ours


def test_a_pending_array_is_expanded_to_its_tasks():
    got = _expand(
        [
            {"job_id": 7, "array_job_id": 7, "array_task_id": None, "array_task_string": "1-2"},
            {"job_id": 9, "array_job_id": 7, "array_task_id": 0},
            {"job_id": 11, "array_job_id": 0, "array_task_id": None},
        ]
    )
    assert sorted(got) == ["11", "7_0", "7_1", "7_2"]


def _job(**kw):
    project = Project(slug="alpha", name="Alpha")
    model = GpuModel(pk=1, name="A100-80GB")
    fields = {
        "pk": 42,
        "name": "train",
        "command": "python train.py",
        "gpus": 2,
        "gpu_model": model,
    }
    fields.update(kw)
    return Job(project=project, **fields)


def _cfg():
    return SlurmPool(
        pool=Pool(name="hpc", backend=Pool.Backend.SLURM),
        cluster_name="hpc",
        conf_path="/etc/slurm/slurm.conf",
        partitions="gpu,gpu-long",
        gpu_types={"A100-80GB": "a100"},
        output_dir="/shared/portal/",
    )


def test_batch_job_options():
    batch = batch_job(
        _cfg(),
        _job(
            nodes=2,
            gpus_per_node=4,
            cpu_milli=16_000,
            memory_mib=64_000,
            time_limit_s=3_725,
            priority=2,
            env={"A": "x y"},
        ),
    )
    args = set(batch.args)
    assert {
        "--partition=gpu,gpu-long",
        "--account=alpha",
        "--qos=high",
        "--nodes=2",
        "--gres=gpu:a100:4",
        "--cpus-per-gpu=2",
        "--mem-per-gpu=8000M",
        "--time=62:05",
        "--no-requeue",
        "--output=/shared/portal/portal-job-42.out",
    } <= args
    assert "export A='x y'" in batch.script
    assert batch.script.rstrip().endswith("python train.py")


def test_batch_job_preemptible_array():
    batch = batch_job(_cfg(), _job(preemptible=True, gpus=1), shards=3)
    assert {"--qos=scavenger", "--requeue", "--array=0-2", "--gres=gpu:a100:1"} <= set(batch.args)
    assert batch.output_pattern.endswith("portal-job-42-%a.out")
    assert 'SHARD_INDEX="$SLURM_ARRAY_TASK_ID"' in batch.script


def test_batch_job_refuses_gpu_shares_and_unmapped_models():
    from scheduler.backends.slurm.client import SlurmError

    with pytest.raises(SlurmError, match="whole GPUs"):
        batch_job(_cfg(), _job(gpus=1, gpu_milli=500))
    with pytest.raises(SlurmError, match="no GPU type for H100"):
        batch_job(_cfg(), _job(gpu_model=GpuModel(pk=2, name="H100")))


def _record(job_id, start, end, *, gpus=2, task=None, state="COMPLETED", steps=()):
    return {
        "job_id": job_id,
        "account": "alpha",
        "nodes": "gpu-[a-b]",
        "array": {"job_id": 5 if task is not None else 0, "task_id": task},
        "state": {"current": state, "reason": "None"},
        "time": {"start": start, "end": end, "elapsed": end - start, "submission": start},
        "tres": {
            "allocated": [
                {"type": "cpu", "name": None, "count": 2},
                {"type": "gres", "name": "gpu", "count": gpus},
                {"type": "gres", "name": "gpu:a100", "count": gpus},
            ]
        },
        "steps": list(steps),
    }


def test_parse_sacct_runs_attempts_and_steps():
    step = {
        "step": {"name": "batch"},
        "time": {"elapsed": 30},
        "tres": {"allocated": [{"type": "gres", "name": "gpu:a100", "count": 2}]},
    }
    runs = parse_sacct(
        {
            "jobs": [
                _record(10, 2_000, 2_100, steps=[step]),
                _record(10, 1_000, 1_050),  # the run before a requeue
                _record(12, 3_000, 3_010, gpus=1, task=3),
                _record(13, 4_000, 0, state="RUNNING"),
            ]
        }
    )
    by = {(r.key, r.attempt): r for r in runs}
    assert set(by) == {("10", 1), ("10", 2), ("5_3", 1), ("13", 1)}
    assert by[("10", 1)].elapsed_s == 50
    assert by[("10", 2)].gpus == {"": 2, "a100": 2}
    assert by[("10", 2)].gpu_count == 2
    assert by[("10", 2)].step_gpu_seconds == {"batch": 60}
    assert by[("10", 2)].nodes == ("gpu-a", "gpu-b")
    assert by[("13", 1)].end is None


def test_a_slurm_job_gets_its_volumes_in_the_script():
    """Volumes map to the cluster's storage root; the checkpoint and the working directory
    follow them; scratch is a directory of the job's own, removed at its end."""
    cfg = _cfg()
    cfg.storage_root = "/lustre/portal-volumes/"
    job = _job(
        volumes=[
            {"name": "ckpt", "path": "/data/ckpt", "read_only": False},
            {"name": "tmp", "path": "/scratch", "read_only": False, "kind": "scratch",
             "size_gib": 5},
        ],
        checkpoint="ckpt:runs/a",
        working_dir="/data/ckpt/runs",
    )  # fmt: skip
    script = batch_job(cfg, job, volume_ids={"ckpt": 7}).script
    assert "export VOLUME_CKPT=/lustre/portal-volumes/v7" in script
    assert 'export CHECKPOINT_DIR="${VOLUME_CKPT}"/runs/a' in script
    assert 'cd "$VOLUME_CKPT"/runs' in script
    assert 'export VOLUME_TMP="${TMPDIR:-/tmp}/portal-job-$SLURM_JOB_ID-tmp"' in script
    assert script.index("VOLUME_CKPT") < script.index("python train.py")


def test_a_slurm_pool_without_a_storage_root_refuses_volumes():
    from scheduler.backends.slurm.client import SlurmError

    job = _job(volumes=[{"name": "ckpt", "path": "/data/ckpt", "read_only": False}])
    with pytest.raises(SlurmError, match="no storage root"):
        batch_job(_cfg(), job, volume_ids={"ckpt": 7})
    cfg = _cfg()
    cfg.storage_root = "/lustre/v"
    with pytest.raises(SlurmError, match="not a shared volume"):
        batch_job(cfg, job, volume_ids={})
