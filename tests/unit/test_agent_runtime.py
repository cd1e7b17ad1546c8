"""The workload runtimes with real processes (and the real Podman where it is installed): the
job's environment is an allow-list, the process runtime runs a job as a uid of its own and
leaves nothing of it behind, the wall-time limit is enforced, MPS limits go to the control
daemon, the container's flags fence it, and the gang network fence holds on the real kernel."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.config import Config
from agent.runner import Assignment, Runner, agent_source_root
from agent.runtime import ContainerRuntime, LaunchError, ProcessRuntime, job_uid, jobnet
from agent.runtime.base import JOB_UID_RANGE, JobUids
from agent.runtime.mps import MpsControl, MpsError
from agent.storage import Storage, StorageError
from tests import polling

IMAGE = os.environ.get("RUNTIME_TEST_IMAGE", "")
UUID = "GPU-11111111-2222-3333-4444-555555555555"
AGENT_SECRETS = {
    "NODE_TOKEN": "node-token-secret",
    "STRIPE_SECRET_KEY": "sk_test_secret",
    "EMAIL_HOST_PASSWORD": "mail-secret",
    "METRICS_TOKEN": "metrics-secret",
    "REDIS_URL": "redis://127.0.0.1:6379/0",
    "DATABASE_URL": "postgres://postgres@127.0.0.1/portal",
}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
needs_engine = pytest.mark.skipif(
    not IMAGE,
    reason=os.environ.get("RUNTIME_TEST_SKIP") or "no job image (run through scripts/test.sh)",
)


def wait_for(predicate: Callable[[], bool], runner: Runner, timeout: float = 15.0) -> None:
    polling.wait_for(predicate, timeout, 0.02, between=runner.poll)


def assignment(job_id: int = 1, command: str = "true", **kw: Any) -> Assignment:
    return Assignment.from_dict(
        {"job_id": job_id, "attempt": 1, "action": "run", "command": command, **kw}
    )


def exits(runner: Runner) -> dict[int, dict[str, Any]]:
    return {m.job_id: m.body for m in runner.outbox if m.kind == "exited"}


def output(runner: Runner, job_id: int) -> str:
    return "".join(m.body["text"] for m in runner.outbox if m.kind == "logs" and m.job_id == job_id)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A workdir job uids can reach (pytest's tmp_path sits under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="agent-runtime-"))
    path.chmod(0o711)
    yield path / "work"
    shutil.rmtree(path, ignore_errors=True)


def make_runner(workdir: Path, runtime: Any, **kw: Any) -> Runner:
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", **AGENT_SECRETS}
    return Runner(workdir, base_env=env, runtime=runtime, log_flush_s=0.05, **kw)


def test_the_jobs_environment_is_an_allow_list(workdir: Path) -> None:
    runner = make_runner(workdir, ProcessRuntime())
    a = assignment(
        command="env",
        env={"MY_VAR": "mine", "JOB_ID": "1", "NODE_TOKEN": "forged", "PORTAL_URL": "x"},
        gpu_uuids=[UUID],
    )
    env = runner.job_env(a)
    assert set(env) == {"PATH", "LANG", "MY_VAR", "JOB_ID", "CUDA_VISIBLE_DEVICES", "PYTHONPATH"}
    assert not set(env.values()) & set(AGENT_SECRETS.values())
    runner.start(a)
    wait_for(lambda: 1 in exits(runner), runner)
    text = output(runner, 1)
    assert "MY_VAR=mine" in text and f"CUDA_VISIBLE_DEVICES={UUID}" in text
    for name, value in AGENT_SECRETS.items():
        assert name not in text and value not in text


@needs_root
def test_the_process_runtime_fences_a_job_in_a_uid_of_its_own(workdir: Path) -> None:
    runtime = ProcessRuntime(uid_base=200_000)
    runner = make_runner(workdir, runtime)
    token = workdir / "token"
    token.write_text("node-token-secret")
    token.chmod(0o600)
    victim_dir = workdir / "jobs" / "7"
    runner.start(assignment(7, "echo victim > secret.txt; sleep 30"))
    wait_for(lambda: (victim_dir / "secret.txt").exists(), runner)
    attack = (
        f"id -u; id -G; umask; cat {token} && echo GOT-TOKEN; cat /proc/{os.getpid()}/environ && echo GOT-ENV; "
        f"cat {victim_dir}/secret.txt && echo GOT-VICTIM; kill -STOP {os.getpid()} && echo GOT-SIG; "
        "setsid sh -c 'sleep 60' </dev/null >/dev/null 2>&1 & echo done"
    )
    runner.start(assignment(8, attack))
    wait_for(lambda: 8 in exits(runner), runner)
    text = output(runner, 8)
    uid_line, groups_line, umask_line = text.splitlines()[:3]
    assert uid_line == str(job_uid(8, 200_000))
    assert groups_line == str(job_uid(8, 200_000))  # its own group, no supplementary ones
    assert umask_line == "0077"
    assert "GOT-" not in text and "done" in text
    assert stat.S_IMODE(victim_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((workdir / "agent-state.json").stat().st_mode) == 0o600
    # The setsid child left the process group; the job's uid is swept when the job ends.
    uid = job_uid(8, 200_000)
    polling.wait_for(
        lambda: not _live_of(uid), 5.0, 0.05
    )  # SIGKILLed; the kernel may take a moment
    runner.stop_all("killed", "test over", grace_s=0)
    wait_for(lambda: 7 in exits(runner), runner)


@pytest.mark.parametrize(
    ("held", "job", "expected"),
    [
        ({}, 7, 1_007),  # nothing held: the job's own uid
        ({1_007: 7}, 7, 1_007),  # held by the job itself (another attempt): shared
        ({1_007: 17}, 7, 1_008),  # ids a range apart: the next free uid
        ({1_007: 17, 1_008: 8}, 7, 1_009),
        ({1_009: 19}, 9, 1_000),  # past the top of the range: wraps to its bottom
    ],
)
def test_job_uids_give_a_job_its_own_uid_unless_another_job_holds_it(
    held: dict[int, int], job: int, expected: int
) -> None:
    uids = JobUids(1_000, size=10)
    for uid, holder in held.items():
        assert uids.acquire(holder) == uid
    assert uids.acquire(job) == expected


def test_job_uids_are_free_again_once_every_attempt_holding_them_ended() -> None:
    uids = JobUids(1_000, size=10)
    first, second = uids.acquire(7), uids.acquire(7)  # two attempts of one job
    assert first == second == 1_007
    uids.release(first)
    assert uids.acquire(17) == 1_008  # one attempt still holds 1_007
    uids.release(second)
    uids.release(None)  # an attempt that never switched uid: nothing to give back
    assert uids.acquire(27) == 1_007
    for job in range(2, 10):  # the other eight
        uids.acquire(job * 10)
    with pytest.raises(LaunchError, match="all 10 job uids"):
        uids.acquire(99)


@needs_root
def test_two_jobs_whose_ids_share_a_uid_slot_run_apart(workdir: Path) -> None:
    """Jobs 5 and 60,005 would both be uid 200,005: the second gets its own, so neither can
    read the other's files, and the first one's end (its uid swept) spares the second."""
    runtime = ProcessRuntime(uid_base=200_000)
    runner = make_runner(workdir, runtime)
    runner.start(assignment(5, "echo mine > own.txt; id -u; sleep 30"))
    other = 5 + JOB_UID_RANGE
    runner.start(
        assignment(other, f"id -u; sleep 1; cat {workdir}/jobs/5/own.txt || echo DENIED; sleep 30")
    )
    wait_for(lambda: "DENIED" in output(runner, other) or "mine" in output(runner, other), runner)
    assert output(runner, 5).split() == [str(job_uid(5, 200_000))]
    assert output(runner, other).split()[0] == str(job_uid(5, 200_000) + 1)
    assert "DENIED" in output(runner, other)
    runner.stop((5, 1), "killed", "test over", grace_s=0)
    wait_for(lambda: 5 in exits(runner), runner)
    time.sleep(0.3)
    runner.poll()
    assert other not in exits(runner)  # still running: the sweep of uid 200,005 spared it
    assert _live_of(job_uid(5, 200_000) + 1)
    runner.stop_all("killed", "test over", grace_s=0)
    wait_for(lambda: other in exits(runner), runner)


@needs_root
def test_a_job_dir_left_under_another_job_uid_is_handed_over_but_nothing_linked_in(
    tmp_path: Path,
) -> None:
    base = 200_000
    storage = Storage(tmp_path / "work")
    storage.ensure_layout()
    folder = tmp_path / "work" / "jobs" / "5"  # an earlier attempt's workspace, under base+5
    (folder / "sub").mkdir(parents=True)
    os.chown(folder, base + 5, base + 5)
    for path in (folder / "sub", folder / "sub" / "model.pt"):
        if not path.exists():
            path.write_text("weights")
        os.chown(path, base + 5, base + 5)
    outside = tmp_path / "root-owned"
    outside.write_text("root's")
    os.link(outside, folder / "link")  # a hard link to a file the job does not own
    (folder / "sym").symlink_to(outside)
    os.lchown(folder / "sym", base + 5, base + 5)
    storage.plan(assignment(5)).prepare(base + 6, job_uids=range(base, base + JOB_UID_RANGE))
    assert folder.stat().st_uid == base + 6
    assert (folder / "sub").stat().st_uid == base + 6
    assert (folder / "sub" / "model.pt").stat().st_uid == base + 6
    assert (folder / "sym").lstat().st_uid == base + 6  # the link itself, not followed
    assert outside.stat().st_uid == 0
    # A workspace not left by a job uid (root's) is not the job's: refused, nothing chowned.
    plain = tmp_path / "work" / "jobs" / "6"
    plain.mkdir()
    (plain / "f").write_text("x")
    with pytest.raises(StorageError, match="is not the job's"):
        storage.plan(assignment(6)).prepare(base + 6, job_uids=range(base, base + JOB_UID_RANGE))
    assert plain.stat().st_uid == 0 and (plain / "f").stat().st_uid == 0


@needs_root
@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "python-switch"])
def test_both_ways_of_switching_uid_give_the_same_fence(
    workdir: Path, setpriv: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """setpriv (vfork, the fast path) and Python's own switch (a full fork, where setpriv is
    missing) start the job alike: its uid and gid, no supplementary group, umask 077."""
    from agent import runner as runner_module

    if setpriv and runner_module.SETPRIV is None:
        pytest.skip("no setpriv on this host")
    if not setpriv:
        monkeypatch.setattr(runner_module, "SETPRIV", None)
    runner = make_runner(workdir, ProcessRuntime(uid_base=200_000))
    runner.start(
        assignment(11, "id -u; id -g; id -G; umask; touch made; ls -ln made; stat -c %a made")
    )
    wait_for(lambda: 11 in exits(runner), runner)
    uid = str(job_uid(11, 200_000))
    lines = output(runner, 11).splitlines()
    assert lines[:4] == [uid, uid, uid, "0077"]
    owner, group = lines[4].split()[2:4]
    assert (owner, group) == (uid, uid)
    assert lines[5] == "600"


@needs_root
def test_one_gang_member_ending_spares_the_other_on_the_same_host(workdir: Path) -> None:
    """Two simulated nodes on one host run a gang's members as the job's one uid: the sweep
    when one member's attempt ends kills its own leftovers, not the other member."""
    uid = job_uid(9, 200_000)
    first = make_runner(workdir / "a", ProcessRuntime(uid_base=200_000))
    second = make_runner(workdir / "b", ProcessRuntime(uid_base=200_000))
    gang = {"NNODES": "2", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    second.start(assignment(9, "sleep 30", env={**gang, "NODE_RANK": "1", "RANK": "1"}))
    wait_for(lambda: bool(_live_of(uid)), second)
    first.start(
        assignment(
            9,
            "setsid sh -c 'sleep 60' </dev/null >/dev/null 2>&1 & true",
            env={**gang, "NODE_RANK": "0", "RANK": "0"},
        )
    )
    wait_for(lambda: 9 in exits(first), first)
    time.sleep(0.5)
    assert second.jobs and all(j.alive for j in second.jobs.values())  # rank 1 still runs
    second.poll()
    assert 9 not in exits(second)
    # rank 0's setsid child is gone; what is left of the uid is rank 1's process group
    (pgid,) = [j.pid for j in second.jobs.values()]
    assert _live_of(uid) and all(os.getpgid(pid) == pgid for pid in _live_of(uid))
    second.stop_all("killed", "test over", grace_s=0)
    wait_for(lambda: 9 in exits(second), second)


# A workload that cannot catch signals (its shell ignores SIGTERM, as a launcher that swallows it
# would) and polls the checkpoint signal file instead.
POLLS_THE_SIGNAL_FILE = (
    'trap "" TERM; echo up; '
    'while [ ! -f "$CHECKPOINT_DIR/stop-requested.json" ]; do sleep 0.1; done; '
    'cat "$CHECKPOINT_DIR/stop-requested.json"; echo; '
    'echo step-7 > "$CHECKPOINT_DIR/ckpt"; echo checkpointed; exit 0'
)
STALE_OR_CLEAN = 'test -e "$CHECKPOINT_DIR/stop-requested.json" && echo stale || echo clean'
# The checkpoint in a node-local volume of project 1 (its jobs share the volume's group).
CHECKPOINT_VOLUME: dict[str, Any] = {
    "project_id": 1,
    "volumes": [{"id": 40, "name": "ckpt", "kind": "node_local", "mount_path": "/data/ckpt"}],
    "checkpoint": {"volume": "ckpt", "path": "runs/a"},
}


def sees_the_checkpoint_signal_file(runner: Runner, job_id: int) -> None:
    """The agent writes the file (why, by when) before its SIGTERM; the workload sees it,
    checkpoints and exits within the grace; the next attempt starts without it."""
    a = assignment(job_id, POLLS_THE_SIGNAL_FILE, grace_seconds=30, **CHECKPOINT_VOLUME)
    runner.start(a)
    wait_for(lambda: "up" in output(runner, job_id), runner, timeout=60)
    before = time.time()
    runner.stop(a.key, "preempted", "stop requested by the portal (resize)", request="resize")
    wait_for(lambda: job_id in exits(runner), runner, timeout=25)  # well inside the grace
    body = exits(runner)[job_id]
    assert body["reason"] == "preempted" and body["exit_code"] == 0
    assert "ended after SIGTERM" in body["message"]  # not killed at the grace's end
    text = output(runner, job_id)
    request = json.loads(next(line for line in text.splitlines() if line.startswith("{")))
    assert request["reason"] == "resize" and request["grace_seconds"] == 30
    assert (request["job_id"], request["attempt"]) == (job_id, 1)
    assert before + 29 <= request["deadline"] <= time.time() + 30
    assert "checkpointed" in text
    host_dir = runner.checkpoint_dir(a)
    assert host_dir is not None and (host_dir / "ckpt").read_text() == "step-7\n"
    runner.start(assignment(job_id, STALE_OR_CLEAN, attempt=2, **CHECKPOINT_VOLUME))
    wait_for(lambda: output(runner, job_id).endswith(("clean\n", "stale\n")), runner, timeout=60)
    assert output(runner, job_id).endswith("clean\n")


def test_a_process_job_that_cannot_catch_sigterm_sees_the_checkpoint_signal_file(
    workdir: Path,
) -> None:
    # as root the job runs as a uid of its own: the agent's file must be readable to it
    runner = make_runner(workdir, ProcessRuntime(uid_base=200_000))
    sees_the_checkpoint_signal_file(runner, 21)


def _live_of(uid: int) -> list[int]:
    """Processes of `uid` that are not zombies."""
    found = []
    for p in Path("/proc").iterdir():
        try:
            state = (
                (p / "stat").read_text().rsplit(")", 1)[1].split()[0] if p.name.isdigit() else ""
            )
            if state and p.stat().st_uid == uid and state not in ("Z", "X"):
                found.append(int(p.name))
        except OSError:
            continue
    return found


def test_a_job_past_its_time_limit_is_stopped_as_time_limit(workdir: Path) -> None:
    runner = make_runner(workdir, ProcessRuntime())
    runner.start(assignment(3, "sleep 30", time_limit_s=1, grace_seconds=5))
    wait_for(lambda: 3 in exits(runner), runner)  # long before the 30 s sleep ends
    body = exits(runner)[3]
    assert body["reason"] == "time_limit" and "limit of 1s" in body["message"]


def test_mps_limits_go_to_the_control_daemon(tmp_path: Path, workdir: Path) -> None:
    got = tmp_path / "mps-commands"
    control = tmp_path / "nvidia-cuda-mps-control"
    control.write_text(f"#!/bin/sh\ncat >> {got}\n")
    control.chmod(0o755)
    runner = make_runner(workdir, ProcessRuntime(mps=MpsControl(control=str(control))))
    runner.start(
        assignment(4, "true", gpu_uuids=[UUID], share_milli=250, gpu_memory_limit_mib=8192)
    )
    wait_for(lambda: 4 in exits(runner), runner)
    assert got.read_text().splitlines() == [
        "set_default_active_thread_percentage 25",
        f"set_default_device_pinned_mem_limit {UUID} 8192M",
    ]
    assert exits(runner)[4]["reason"] == "exited"
    # A daemon that refuses: the job does not start without its limits.
    control.write_text("#!/bin/sh\necho 'error: no MPS server' >&2; exit 1\n")
    refused = MpsControl(control=str(control))
    with pytest.raises(MpsError):
        refused.limit([UUID], 500, None)
    assert issubclass(MpsError, LaunchError)


def test_the_agent_refuses_a_token_file_others_can_read(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("t")
    token.chmod(0o644)
    env = {"PORTAL_URL": "http://x", "AGENT_WORKDIR": str(tmp_path)}
    with pytest.raises(SystemExit):
        Config.from_args(["--token-file", str(token)], env)
    token.chmod(0o600)
    assert Config.from_args(["--token-file", str(token)], env).token == "t"
    assert Config.from_args(["--token-file", str(token)], env).runtime == "container"


# -- the container runtime on the real engine -----------------------------------------------------


@pytest.fixture
def containers(workdir: Path) -> Iterator[Runner]:
    runtime = ContainerRuntime(
        default_image=IMAGE, agent_source=agent_source_root(), node_label="unit-test"
    )
    runner = make_runner(workdir, runtime)
    yield runner
    runner.stop_all("killed", "test over", grace_s=0)
    runner.wait_all(20)


@needs_engine
def test_a_container_job_is_fenced_by_its_flags(containers: Runner) -> None:
    runtime = containers.runtime
    assert isinstance(runtime, ContainerRuntime)
    runtime.gpu_devices = True  # as on a real GPU host: the launch only builds the command
    a = assignment(5, "true", env={"SECRET": "s3cr3t"}, gpu_uuids=[UUID], memory_mib=256)
    launch = runtime.launch(a, plan=containers.storage.plan(a), env=containers.job_env(a))
    try:
        argv = launch.argv
        for flag in ("--network=none", "--cap-drop=all", "--security-opt=no-new-privileges"):
            assert flag in argv
        assert f"--user={job_uid(5)}:{job_uid(5)}" in argv
        assert f"--device=nvidia.com/gpu={UUID}" in argv
        assert "--pids-limit=4096" in argv and "--pull=never" in argv
        assert not any("s3cr3t" in arg for arg in argv)  # env values are not in ps
        env_file = Path(launch.extra["env_file"])
        assert env_file.parent == containers.workdir / "run"  # the agent's alone
        assert stat.S_IMODE(env_file.parent.stat().st_mode) == 0o700
        assert env_file.parent.stat().st_uid == os.geteuid()
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        assert "SECRET=s3cr3t" in env_file.read_text()
        assert not set(launch.env) & {"SECRET", *AGENT_SECRETS}  # Podman's own env
        assert launch.image_digest.startswith("sha256:")
    finally:
        runtime.cleanup(launch)
    assert not env_file.exists()


@needs_engine
def test_a_container_gets_the_shared_memory_its_job_asked_for(containers: Runner) -> None:
    runtime = containers.runtime
    assert isinstance(runtime, ContainerRuntime)
    plain = assignment(11, "true")
    launch = runtime.launch(
        plain, plan=containers.storage.plan(plain), env=containers.job_env(plain)
    )
    runtime.cleanup(launch)
    assert not any(arg.startswith("--shm-size") for arg in launch.argv)  # the engine's default
    containers.start(assignment(12, "df -k /dev/shm", shm_mib=96))
    wait_for(lambda: 12 in exits(containers), containers, timeout=30)
    assert exits(containers)[12]["reason"] == "exited"
    assert exits(containers)[12]["exit_code"] == 0
    size_kib = output(containers, 12).splitlines()[-1].split()[1]
    assert int(size_kib) == 96 * 1024


@needs_engine
def test_a_container_past_its_time_limit_ends_as_time_limit(containers: Runner) -> None:
    containers.start(assignment(6, "echo up; sleep 60", time_limit_s=1, grace_seconds=2))
    wait_for(lambda: 6 in exits(containers), containers, timeout=30)
    assert exits(containers)[6]["reason"] == "time_limit"
    assert "up" in output(containers, 6)


@needs_engine
def test_a_container_job_that_cannot_catch_sigterm_sees_the_checkpoint_signal_file(
    containers: Runner,
) -> None:
    sees_the_checkpoint_signal_file(containers, 22)


@needs_engine
def test_a_container_job_with_a_missing_image_fails_to_start_naming_it(
    containers: Runner,
) -> None:
    containers.start(assignment(9, "true", image="localhost/absent:0"))
    body = exits(containers)[9]  # at once: nothing was started
    assert body["reason"] == "failed_to_start" and "localhost/absent:0" in body["message"]
    assert not [m for m in containers.outbox if m.kind == "started"]


@needs_engine
def test_the_agent_keeps_the_curated_images_pulled(containers: Runner) -> None:
    """What the node has is kept; what it lacks is pulled (here no registry answers, so the
    absent image stays absent, and is tried again on the next heartbeat)."""
    runtime = containers.runtime
    assert isinstance(runtime, ContainerRuntime)
    assert runtime.pull_missing([IMAGE, "localhost:1/absent:0"]) == [IMAGE]
    runtime.keep_pulled([IMAGE])  # already known: no pull started
    assert runtime._puller is None
    runtime.keep_pulled(["localhost:1/absent:0"])
    assert runtime._puller is not None
    runtime._puller.join(60)
    assert "localhost:1/absent:0" not in runtime._pulled


# -- the gang network fence -------------------------------------------------------------------

needs_nft = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("nft") is None, reason="the fence needs root and nft"
)
GANG_ENV = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "NNODES": "2", "NODE_RANK": "1"}


def test_the_fence_is_keyed_on_the_job_uids_and_the_gang_networks() -> None:
    text, digest = jobnet.ruleset(300_000, ["10.20.0.0/16", "fd00::/64"])
    assert "meta skuid 300000-359999" in text
    assert "elements = { 10.20.0.0/16 }" in text and "elements = { fd00::/64 }" in text
    assert f'comment "gpucloud-jobnet {digest}"' in text
    assert jobnet.ruleset(300_000)[1] != digest  # other networks, another table
    assert jobnet.parse_networks(["10.1.2.3/16", " ", "::1"]) == ("10.1.0.0/16", "::1/128")
    with pytest.raises(ValueError, match="not a network"):
        jobnet.parse_networks(["the cluster"])
    env = {"PORTAL_URL": "http://x", "NODE_TOKEN": "t", "AGENT_GANG_NETWORKS": "10.0.0.0/8,x"}
    with pytest.raises(SystemExit):
        Config.from_args([], env)
    env["AGENT_GANG_NETWORKS"] = "10.0.0.0/8, fd00::/8"
    assert Config.from_args([], env).gang_networks == ("10.0.0.0/8", "fd00::/8")


def test_the_abstract_unix_sockets_the_fence_cannot_see_are_named() -> None:
    """Gang members share the node's network namespace and so its abstract Unix sockets."""
    name = f"gpucloud-test-{os.getpid()}"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind("\0" + name)
        assert f"@{name}" not in jobnet.abstract_listeners()  # bound, not listening
        sock.listen()
        assert f"@{name}" in jobnet.abstract_listeners()
    assert f"@{name}" not in jobnet.abstract_listeners()


@needs_engine
def test_a_gang_member_gets_the_nodes_network_only_behind_the_fence(containers: Runner) -> None:
    runtime = containers.runtime
    assert isinstance(runtime, ContainerRuntime)
    member = assignment(21, "true", env=GANG_ENV)
    alone = assignment(22, "true", env={**GANG_ENV, "NNODES": "1", "NODE_RANK": "0"})

    def launch(a: Assignment) -> list[str]:
        started = runtime.launch(a, plan=containers.storage.plan(a), env=containers.job_env(a))
        runtime.cleanup(started)
        return started.argv

    runtime.network = None
    with pytest.raises(LaunchError, match="no job network fence"):
        launch(member)
    assert "--network=none" in launch(alone)
    runtime.network = jobnet.JobNetwork(uid_base=300_000, nft="false")
    with pytest.raises(LaunchError, match="its network fence is not in place"):
        launch(member)
    assert "--network=none" in launch(alone)
    if os.geteuid() == 0 and shutil.which("nft"):
        runtime.network = jobnet.JobNetwork(uid_base=runtime.uid_base)
        argv = launch(member)
        assert "--network=host" in argv and "--network=none" not in argv
        assert argv[argv.index("--name") + 1] == "gpucloud-job-21-1-1"  # its node rank


def as_uid(uid: int, fn: Callable[[], str]) -> str:
    """Run `fn` in a child process of uid `uid`; what it returns (or the error it raised)."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            out = fn()
        except BaseException as exc:
            out = f"blocked: {type(exc).__name__}"
        os.write(write, out.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        out = f.read()
    os.waitpid(pid, 0)
    return out


@needs_nft
def test_the_fence_lets_a_job_uid_reach_only_sockets_of_its_own_uid() -> None:
    """On the real kernel, without containers: uids of the fenced range connect to sockets of
    their own uid only; a daemon of the host's (root's) and another job uid's never answer."""
    base = 300_000  # a table of its own, removed afterwards
    net = jobnet.JobNetwork(uid_base=base)
    assert net.ensure() is None and net.in_place()
    children: list[int] = []
    host = socket.create_server(("127.0.0.1", 0))

    def listen_as(uid: int) -> int:
        """A listener owned by `uid` (a child of that uid creates it); its port."""
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns into pytest
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            server = socket.create_server(("127.0.0.1", 0))
            os.write(write, str(server.getsockname()[1]).encode())
            while True:
                conn, _ = server.accept()
                conn.close()
        os.close(write)
        children.append(pid)
        port = os.read(read, 16)  # the child keeps its end open while it serves
        os.close(read)
        return int(port)

    def connect(port: int) -> Callable[[], str]:
        def go() -> str:
            socket.create_connection(("127.0.0.1", port), timeout=2).close()
            return "connected"

        return go

    try:
        own, other = listen_as(base + 1), listen_as(base + 2)
        assert as_uid(base + 1, connect(own)) == "connected"
        assert as_uid(base + 1, connect(other)) == "blocked: TimeoutError"
        assert as_uid(base + 1, connect(host.getsockname()[1])) == "blocked: TimeoutError"
        # a closed port answers no reset either: a job cannot map what listens on the host
        assert as_uid(base + 1, connect(1)) == "blocked: TimeoutError"
        assert connect(other)() == "connected"  # the host itself reaches a job's socket
        assert as_uid(500, connect(own)) == "connected"  # uids outside the range: no fence
    finally:
        host.close()
        for pid in children:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        subprocess.run(["nft", "delete", "table", "inet", net.table], check=False)


# -- the process runtime execs a plain simple command without the shell ----------------------

SLEEP = os.path.realpath(shutil.which("sleep") or "/bin/sleep")
SHELL = os.path.realpath("/bin/sh")


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (line.partition(":") for line in lines)}


@pytest.fixture
def programs(workdir: Path) -> Path:
    """A directory with a `#!` script, a script without one and a non-executable file."""
    path = workdir.parent / "programs"
    (path / "bin").mkdir(parents=True)
    (path / "run.sh").write_text("#!/bin/sh\necho ran\n")
    (path / "bin" / "tool").write_text("#!/bin/sh\necho tool\n")
    (path / "noshebang").write_text("echo as a shell script\n")
    (path / "data").write_text("#!/bin/sh\n")
    for name in ("run.sh", "bin/tool", "noshebang"):
        (path / name).chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("command", "argv"),
    [
        ("sleep 3600", ["sleep", "3600"]),
        ("  sleep\t1  ", ["sleep", "1"]),
        ("/bin/sleep 0", ["/bin/sleep", "0"]),
        ("env", ["env"]),
        (
            "python3 -m agent.workload --steps=5 --out=a,b:c+d%e@f -x",
            ["python3", "-m", "agent.workload", "--steps=5", "--out=a,b:c+d%e@f", "-x"],
        ),
        ("./run.sh", ["./run.sh"]),  # a `#!` script under the job's cwd
        ("tool --flag", ["tool", "--flag"]),  # found through a relative PATH entry
        # shell syntax: quoting, expansion, globs, operators, redirections, grouping, comments
        ("sleep 1 | cat", None),
        ("sleep $DELAY", None),
        ("sleep ${DELAY}", None),
        ("echo 'a'", None),
        ('sleep "1"', None),
        ("sleep `echo 1`", None),
        ("sleep 1\\ 2", None),
        ("ls *", None),
        ("ls ?", None),
        ("ls [ab]", None),
        ("ls ~", None),
        ("sleep 1 # why", None),
        ("sleep 1; ls", None),
        ("sleep 1 &", None),
        ("sleep 1 && ls", None),
        ("cat < x", None),
        ("ls > x", None),
        ("(sleep 1)", None),
        ("sleep 1\nls", None),
        ("sleep 1\rls", None),
        # builtins and keywords, even where a program of that name exists
        ("echo hi", None),
        ("true", None),
        ("false", None),
        ("test 1 = 2", None),
        ("[ 1 = 2 ]", None),
        ("exit 3", None),
        ("cd x", None),
        ("kill -9 1", None),
        ("printf x", None),
        ("pwd", None),
        ("time sleep 1", None),
        ("exec sleep 1", None),
        ("if", None),
        ("{", None),
        # an assignment, and programs the shell must report (not found, not executable)
        ("FOO=1 env", None),
        ("a-b=1 env", None),
        ("no-such-program-here 1", None),
        ("./missing.sh", None),
        ("./data", None),  # not executable
        ("./bin", None),  # a directory
        ("./noshebang", None),  # the shell runs it as a script; exec(2) would refuse it
        ("", None),
        ("   ", None),
    ],
)
def test_which_commands_run_without_the_shell(
    programs: Path, command: str, argv: list[str] | None
) -> None:
    from agent.runtime.process import direct_argv

    env = {"PATH": f"bin:{os.environ['PATH']}"}
    assert direct_argv(command, env, programs) == argv


def test_a_fifo_on_the_jobs_path_keeps_the_shell_without_blocking_the_agent(
    programs: Path,
) -> None:
    """The agent reads a program's first bytes as itself: a FIFO an earlier attempt left on the
    job's PATH (opening it would wait for a writer, and the agent with it) is never opened."""
    from agent.runtime.process import direct_argv

    trap = programs / "trap"
    trap.mkdir()
    os.mkfifo(trap / "sleep", 0o755)
    env = {"PATH": f"trap:{os.environ['PATH']}"}
    answers: list[object] = []

    def read() -> None:  # opening the FIFO would block here for good
        answers.append(direct_argv("sleep 1", env, programs))
        answers.append(direct_argv("./trap/sleep 1", env, programs))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(30)  # a deadline for the test, not a speed claim
    assert not reader.is_alive(), "the FIFO was opened"
    assert answers == [None, None]


def test_a_job_that_sets_its_own_pwd_or_has_no_path_keeps_the_shell(programs: Path) -> None:
    from agent.runtime.process import direct_argv

    assert direct_argv("sleep 1", {"PATH": os.environ["PATH"]}, programs) == ["sleep", "1"]
    assert direct_argv("sleep 1", {"PATH": os.environ["PATH"], "PWD": "/"}, programs) is None
    assert direct_argv("sleep 1", {}, programs) is None


def test_a_simple_command_is_the_jobs_main_process(workdir: Path) -> None:
    runner = make_runner(workdir, ProcessRuntime())
    job = runner.start(assignment(21, "sleep 30", grace_seconds=5))
    assert job.pid is not None and job.launch is not None
    assert job.launch.argv == ["sleep", "30"]
    assert _exe(job.pid) == SLEEP  # no shell in between
    assert Path(f"/proc/{job.pid}/cmdline").read_bytes() == b"sleep\x0030\x00"
    assert os.getpgid(job.pid) == job.pid and os.getsid(job.pid) == job.pid
    # A stop still reaches it through its process group, and its status is reported as before.
    assert runner.stop((21, 1), "preempted", "preempted by the portal")
    wait_for(lambda: 21 in exits(runner), runner)
    body = exits(runner)[21]
    assert body["reason"] == "preempted" and body["signal"] == signal.SIGTERM
    assert body["exit_code"] is None and "ended after SIGTERM" in body["message"]


def test_a_command_with_shell_syntax_still_runs_through_the_shell(workdir: Path) -> None:
    runner = make_runner(workdir, ProcessRuntime())
    job = runner.start(assignment(22, "sleep 30; true", grace_seconds=5))
    assert job.pid is not None and job.launch is not None
    assert job.launch.argv == ["/bin/sh", "-c", "sleep 30; true"]
    assert _exe(job.pid) == SHELL
    runner.stop((22, 1), "cancelled", "cancelled by the user")
    wait_for(lambda: 22 in exits(runner), runner)
    assert exits(runner)[22]["signal"] == signal.SIGTERM

    cases = {
        23: ("echo abc | tr a x", 0, "xbc\n"),
        24: ("echo \"$FOO-${FOO}\" '$FOO'", 0, "one-one $FOO\n"),
        25: ("exit 3", 3, ""),
        26: ("mkdir -p sub && cd sub && pwd", 0, f"{os.path.realpath(workdir)}/jobs/26/sub\n"),
        27: ("FOO=1 env", 0, "FOO=1\n"),
        28: ("false", 1, ""),
    }
    for job_id, (command, _, _) in cases.items():
        started = runner.start(assignment(job_id, command, env={"FOO": "one"}))
        assert started.launch is not None
        assert started.launch.argv == ["/bin/sh", "-c", command]
    wait_for(lambda: set(cases) <= set(exits(runner)), runner)
    for job_id, (command, code, text) in cases.items():
        assert exits(runner)[job_id]["exit_code"] == code, command
        if job_id == 27:
            assert text in output(runner, job_id)
        else:
            assert output(runner, job_id) == text, command


def test_a_missing_program_still_exits_127_through_the_shell(workdir: Path) -> None:
    runner = make_runner(workdir, ProcessRuntime())
    job = runner.start(assignment(31, "no-such-program-here --flag"))
    assert job.launch is not None and job.launch.argv[:2] == ["/bin/sh", "-c"]
    wait_for(lambda: 31 in exits(runner), runner)
    body = exits(runner)[31]
    assert (body["reason"], body["exit_code"], body["signal"]) == ("exited", 127, None)
    assert "no-such-program-here: not found" in output(runner, 31)


def test_a_direct_program_reports_as_through_the_shell(workdir: Path) -> None:
    """Exit code, message, output and environment of a program exec'd directly are those the
    same program gives as the shell's child (`{ ...; }` keeps the shell)."""
    runner = make_runner(workdir, ProcessRuntime())
    pairs = {
        41: ("/bin/ls /nonexistent-here", "{ /bin/ls /nonexistent-here; }"),
        43: ("/bin/sleep 0", "{ /bin/sleep 0; }"),
        45: ("env", "{ env; }"),
    }
    for job_id, (direct, shell) in pairs.items():
        a = runner.start(assignment(job_id, direct, env={"X": "1"}))
        b = runner.start(assignment(job_id + 1, shell, env={"X": "1"}))
        assert a.launch is not None and a.launch.argv == direct.split()
        assert b.launch is not None and b.launch.argv[:2] == ["/bin/sh", "-c"]
    wait_for(lambda: len(exits(runner)) == 2 * len(pairs), runner)
    for job_id in pairs:
        direct_body, shell_body = exits(runner)[job_id], exits(runner)[job_id + 1]
        assert {**direct_body, "attempt": 0} == {**shell_body, "attempt": 0}
        direct_out, shell_out = output(runner, job_id), output(runner, job_id + 1)
        if job_id == 45:  # each in its own workspace: PWD names it, the rest is the same
            pwd = f"PWD={os.path.realpath(workdir)}/jobs/{job_id}"
            assert pwd in direct_out.splitlines()
            assert f"PWD={os.path.realpath(workdir)}/jobs/{job_id + 1}" in shell_out.splitlines()
            rest = sorted(line for line in direct_out.splitlines() if not line.startswith("PWD="))
            assert rest == sorted(
                line for line in shell_out.splitlines() if not line.startswith("PWD=")
            )
        else:
            assert direct_out == shell_out
    assert exits(runner)[41]["exit_code"] == 2 and exits(runner)[43]["exit_code"] == 0
    assert "nonexistent-here" in output(runner, 41)


def test_a_direct_program_that_ignores_sigterm_is_killed_after_the_grace(
    workdir: Path, programs: Path
) -> None:
    script = programs / "stubborn.py"
    script.write_text(
        f"#!{sys.executable}\n"
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\n"
        "time.sleep(300)\n"
    )
    script.chmod(0o755)
    runner = make_runner(workdir, ProcessRuntime())
    job = runner.start(assignment(51, str(script), grace_seconds=0.5))
    assert job.launch is not None and job.launch.argv == [str(script)]
    wait_for(lambda: "ready" in output(runner, 51), runner)
    assert os.getpgid(job.pid or 0) == job.pid
    started = time.monotonic()
    runner.stop((51, 1), "cancelled", "cancelled by the user")
    wait_for(lambda: 51 in exits(runner), runner)
    assert time.monotonic() - started >= 0.5  # the grace was waited out (a lower bound)
    body = exits(runner)[51]
    assert body["signal"] == signal.SIGKILL and "SIGKILL after 0.5s grace" in body["message"]


@needs_root
@pytest.mark.parametrize("setpriv", [True, False], ids=["setpriv", "python-switch"])
def test_a_direct_program_gets_the_same_fence(
    workdir: Path, setpriv: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exec'd directly (through setpriv, or Python's own switch), the program runs as the job's
    uid and gid, no supplementary groups, umask 077, as the shell did."""
    from agent import runner as runner_module

    if setpriv and runner_module.SETPRIV is None:
        pytest.skip("no setpriv on this host")
    if not setpriv:
        monkeypatch.setattr(runner_module, "SETPRIV", None)
    runner = make_runner(workdir, ProcessRuntime(uid_base=200_000))
    job = runner.start(assignment(61, "sleep 30", grace_seconds=5))
    assert job.pid is not None and job.launch is not None
    assert job.launch.argv == ["sleep", "30"]
    wait_for(lambda: _exe(job.pid or 0) == SLEEP, runner)  # setpriv has exec'd it
    status = _status(job.pid)
    uid = str(job_uid(61, 200_000))
    assert status["Uid"].split() == [uid] * 4 and status["Gid"].split() == [uid] * 4
    assert status["Groups"] == "" and status["Umask"] == "0077"
    assert os.getpgid(job.pid) == job.pid
    runner.stop_all("killed", "test over", grace_s=5)
    wait_for(lambda: 61 in exits(runner), runner)
    assert exits(runner)[61]["signal"] == signal.SIGTERM
    assert not _live_of(int(uid))
