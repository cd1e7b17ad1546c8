"""The node's trust boundary for storage (issue 27), with real files, links and processes.

Each finding of the review is reproduced at the agent: a job that names a host path (`/root`,
another tenant's job directory, the portal's virtualenv) as its working or checkpoint
directory gets none of them; a symlink a job plants where the root agent writes (the stop
file, a checkpoint directory) never redirects the write; the container's env file is gone
once the container runs. And: volumes shared by a project's jobs, quotas, space given back.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import sysconfig
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from agent import hostfs, loopfs
from agent.protocol import EXIT_REASONS, FAILURE_TEXT, STOP_FILE
from agent.runner import Assignment, Runner, agent_source_root
from agent.runtime import ContainerRuntime, ProcessRuntime, job_uid
from agent.storage import Storage, StorageError
from tests import polling

IMAGE = os.environ.get("RUNTIME_TEST_IMAGE", "")
BASE = 200_000
GID_BASE = 300_000
# The host directory the review handed to a tenant (`workingDir: /root`): root's home on any host.
HOST_ROOT = Path("/root")
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="switching uids needs root")
needs_engine = pytest.mark.skipif(
    not IMAGE,
    reason=os.environ.get("RUNTIME_TEST_SKIP") or "no job image (run through scripts/test.sh)",
)


def assignment(job_id: int, command: str = "true", **kw: Any) -> Assignment:
    return Assignment.from_dict(
        {"job_id": job_id, "attempt": 1, "action": "run", "command": command, **kw}
    )


def node_local(volume_id: int, name: str = "data", **kw: Any) -> dict[str, Any]:
    return {
        "id": volume_id,
        "name": name,
        "kind": "node_local",
        "mount_path": f"/data/{name}",
        **kw,
    }


def exits(runner: Runner) -> dict[int, dict[str, Any]]:
    return {m.job_id: m.body for m in runner.outbox if m.kind == "exited"}


def output(runner: Runner, job_id: int) -> str:
    return "".join(m.body["text"] for m in runner.outbox if m.kind == "logs" and m.job_id == job_id)


def wait_for(predicate: Callable[[], bool], runner: Runner, timeout: float = 15.0) -> None:
    polling.wait_for(predicate, timeout, 0.02, between=runner.poll)


@pytest.fixture
def workdir() -> Iterator[Path]:
    """A workdir job uids can reach (pytest's tmp_path sits under a 0700 directory)."""
    path = Path(tempfile.mkdtemp(prefix="agent-storage-"))
    path.chmod(0o711)
    yield path / "work"
    shutil.rmtree(path, ignore_errors=True)


def make_runner(workdir: Path, runtime: Any = None, **kw: Any) -> Runner:
    runtime = runtime or ProcessRuntime(uid_base=BASE if os.geteuid() == 0 else None)
    env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8"}
    kw.setdefault("project_gid_base", GID_BASE)
    return Runner(workdir, base_env=env, runtime=runtime, log_flush_s=0.05, **kw)


@pytest.fixture
def runner(workdir: Path) -> Iterator[Runner]:
    r = make_runner(workdir)
    yield r
    r.stop_all("killed", "test over", grace_s=0)
    r.wait_all(10)


def fingerprint(path: Path) -> tuple[int, int, int]:
    st = path.lstat()
    return st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)


# -- no host path from the portal -----------------------------------------------------------------


@needs_root
def test_a_job_naming_root_as_its_working_and_checkpoint_dir_gets_its_own_workspace(
    runner: Runner,
) -> None:
    """`workingDir: /root` handed the host's /root to a tenant: now it is a path in the
    container, the checkpoint_dir and CHECKPOINT_DIR host paths are dropped."""
    before = fingerprint(Path("/root"))
    a = assignment(
        51,
        f'pwd; echo "ckpt=$CHECKPOINT_DIR"; touch {HOST_ROOT}/owned-by-a-tenant && echo WROTE-ROOT',
        working_dir="/root",
        checkpoint_dir="/root",
        env={"CHECKPOINT_DIR": "/root"},
    )
    runner.start(a)
    wait_for(lambda: 51 in exits(runner), runner)
    lines = output(runner, 51).splitlines()
    assert lines[0] == str(runner.workdir / "jobs" / "51")
    assert lines[1] == "ckpt="
    assert "WROTE-ROOT" not in lines
    assert fingerprint(Path("/root")) == before  # never chowned nor chmodded
    assert not (HOST_ROOT / "owned-by-a-tenant").exists()


@needs_root
def test_a_job_naming_another_tenants_job_dir_reads_and_poisons_nothing(runner: Runner) -> None:
    victim = runner.workdir / "jobs" / "61"
    runner.start(
        assignment(
            61, "echo their-secret > secret.txt; mkdir -p ck; echo step-9 > ck/model; sleep 30"
        )
    )
    wait_for(lambda: (victim / "ck" / "model").exists(), runner)
    victim_before = fingerprint(victim), fingerprint(victim / "ck" / "model")
    attack = (
        f"cat {victim}/secret.txt && echo GOT-SECRET; "
        f'echo poisoned > {victim}/ck/model && echo POISONED; echo "cwd=$(pwd)"'
    )
    runner.start(
        assignment(
            62,
            attack,
            working_dir=str(victim),
            checkpoint_dir=str(victim / "ck"),
            env={"CHECKPOINT_DIR": str(victim / "ck")},
        )
    )
    wait_for(lambda: 62 in exits(runner), runner)
    text = output(runner, 62)
    assert "GOT-SECRET" not in text and "POISONED" not in text
    assert f"cwd={runner.workdir / 'jobs' / '62'}" in text.splitlines()
    assert (fingerprint(victim), fingerprint(victim / "ck" / "model")) == victim_before
    assert victim_before[0][0] == job_uid(61, BASE)
    assert (victim / "ck" / "model").read_text() == "step-9\n"


@needs_root
def test_a_job_naming_the_portals_virtualenv_changes_nothing_there(runner: Runner) -> None:
    """A job named site-packages as its working dir, dropped a .pth file, and the next
    `manage.py` ran it as root."""
    site = Path(sysconfig.get_paths()["purelib"])
    before = fingerprint(site)
    runner.start(
        assignment(
            71,
            f"echo 'import os' > {site}/evil.pth && echo DROPPED; pwd",
            working_dir=str(site),
            checkpoint_dir=str(site),
        )
    )
    wait_for(lambda: 71 in exits(runner), runner)
    assert "DROPPED" not in output(runner, 71)
    assert not (site / "evil.pth").exists()
    assert fingerprint(site) == before


@pytest.mark.parametrize(
    ("storage", "message"),
    [
        ({"volumes": [node_local(1, name="../etc")]}, "is not a volume name"),
        ({"volumes": [node_local(1, mount_path="/data/../proc")]}, "not a usable path"),
        ({"volumes": [node_local(1, mount_path="/proc/x")]}, "is reserved"),
        ({"volumes": [node_local(1, mount_path="relative")]}, "must be an absolute path"),
        ({"volumes": [{**node_local(1), "kind": "hostPath"}]}, "unknown kind"),
        ({"volumes": [{**node_local(1), "id": "/etc"}]}, "id must be an integer"),
        ({"volumes": [node_local(0)]}, "needs its id"),
        ({"volumes": [node_local(1), node_local(2)]}, "is named twice"),
        (
            {"volumes": [node_local(1), node_local(2, name="b", mount_path="/data/data/b")]},
            "is nested with /data/data",
        ),
        ({"volumes": [node_local(1, mount_path="/workspace/x")]}, "is reserved"),
        (
            {"volumes": [node_local(1)], "checkpoint": {"volume": "data", "path": "../../x"}},
            "not a usable path inside a volume",
        ),
        (
            {"volumes": [node_local(1)], "checkpoint": {"volume": "data", "path": "/etc"}},
            "relative to its volume",
        ),
        ({"volumes": [node_local(1)], "checkpoint": {"volume": "other"}}, "not one of the job's"),
        (
            {"volumes": [node_local(1, read_only=True)], "checkpoint": {"volume": "data"}},
            "mounted read-only",
        ),
        ({"volumes": [{**node_local(1), "kind": "shared"}]}, "no AGENT_SHARED_ROOT"),
        ({"working_dir": "../../etc"}, "working_dir must be an absolute path"),
    ],
)
def test_storage_the_agent_will_not_use_fails_the_start_saying_why(
    runner: Runner, storage: dict[str, Any], message: str
) -> None:
    runner.start(assignment(81, "echo RAN", project_id=1, **storage))
    body = exits(runner)[81]
    assert body["reason"] == "failed_to_start" and message in body["message"], body
    assert not [m for m in runner.outbox if m.kind == "started"]
    assert not list((runner.workdir / "volumes").iterdir())  # nothing created


# -- privileged writes never follow a job's links ---------------------------------------------------


def stop_file_job(runner: Runner, job_id: int, plant: str, **kw: Any) -> Assignment:
    """A job with its checkpoint in node-local volume 90 that plants `plant` and waits."""
    a = assignment(
        job_id,
        f"{plant}; echo planted; sleep 30",
        project_id=4,
        volumes=[node_local(90, name="ckpt")],
        checkpoint={"volume": "ckpt", "path": "runs/x"},
        grace_seconds=5,
        **kw,
    )
    runner.start(a)
    wait_for(lambda: "planted" in output(runner, job_id), runner)
    return a


@needs_root
def test_a_symlink_planted_at_the_stop_file_does_not_redirect_the_write(
    runner: Runner, tmp_path: Path
) -> None:
    outside = tmp_path / "host-file"  # stands for /etc/shadow, the agent's token...
    outside.write_text("the host's\n")
    outside.chmod(0o644)
    a = stop_file_job(runner, 91, f'ln -s {outside} "$CHECKPOINT_DIR/{STOP_FILE}"')
    ck = runner.workdir / "volumes" / "v90" / "runs" / "x"
    assert (ck / STOP_FILE).is_symlink()
    runner.stop(a.key, "preempted", "stop requested by the portal (preempt)", request="preempt")
    wait_for(lambda: 91 in exits(runner), runner)
    assert outside.read_text() == "the host's\n" and fingerprint(outside) == (0, 0, 0o644)
    written = ck / STOP_FILE
    assert not written.is_symlink() and json.loads(written.read_text())["reason"] == "preempt"
    assert written.stat().st_uid == job_uid(91, BASE)  # the job's file, in the job's volume


@needs_root
def test_a_checkpoint_dir_swapped_for_a_symlink_is_not_written_through(
    runner: Runner, tmp_path: Path
) -> None:
    outside = tmp_path / "host-dir"
    outside.mkdir()
    os.chmod(outside, 0o777)  # even a directory the job could reach itself
    a = stop_file_job(runner, 92, f'cd "$CHECKPOINT_DIR/.." && rmdir x && ln -s {outside} x')
    runner.stop(a.key, "preempted", "preempt", request="preempt")
    wait_for(lambda: 92 in exits(runner), runner)
    assert list(outside.iterdir()) == []  # no stop file landed outside
    # The next attempt finds the link where its checkpoint directory was: it does not start.
    runner.start(
        Assignment.from_dict(
            {
                "job_id": 92,
                "attempt": 2,
                "command": "true",
                "project_id": 4,
                "volumes": [node_local(90, name="ckpt")],
                "checkpoint": {"volume": "ckpt", "path": "runs/x"},
            }
        )
    )
    body = next(m.body for m in runner.outbox if m.kind == "exited" and m.attempt == 2)
    assert body["reason"] == "failed_to_start" and "'x' is a symlink" in body["message"]
    assert list(outside.iterdir()) == []


@needs_root
def test_the_stop_file_link_is_removed_at_the_next_start_not_its_target(
    runner: Runner, tmp_path: Path
) -> None:
    outside = tmp_path / "keep-me"
    outside.write_text("keep")
    a = stop_file_job(runner, 93, f'ln -s {outside} "$CHECKPOINT_DIR/{STOP_FILE}"')
    runner.stop(a.key, "killed", "test", grace_s=0)
    wait_for(lambda: 93 in exits(runner), runner)
    ck = runner.workdir / "volumes" / "v90" / "runs" / "x"
    assert (ck / STOP_FILE).exists()  # the agent's request, replacing the link
    (ck / STOP_FILE).unlink()
    (ck / STOP_FILE).symlink_to(outside)
    runner.start(
        Assignment.from_dict(
            {
                "job_id": 93,
                "attempt": 2,
                "command": "true",
                "project_id": 4,
                "volumes": [node_local(90, name="ckpt")],
                "checkpoint": {"volume": "ckpt", "path": "runs/x"},
            }
        )
    )
    assert not os.path.lexists(ck / STOP_FILE)
    assert outside.read_text() == "keep"


def test_remove_tree_never_follows_a_link(tmp_path: Path) -> None:
    assert shutil.rmtree.avoids_symlink_attacks
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "precious").write_text("x")
    tree = tmp_path / "jobs" / "5"
    (tree / "deep").mkdir(parents=True)
    (tree / "deep" / "link").symlink_to(outside)
    (tree / "file-link").symlink_to(outside / "precious")
    os.link(outside / "precious", tree / "hard")
    with hostfs.opened(hostfs.open_dir(tmp_path / "jobs")) as fd:
        assert hostfs.remove_tree(fd, "5")
        assert not hostfs.remove_tree(fd, "5")
    assert not tree.exists()
    assert (outside / "precious").read_text() == "x"
    # a link at the top is removed as a link
    (tmp_path / "jobs" / "6").symlink_to(outside)
    with hostfs.opened(hostfs.open_dir(tmp_path / "jobs")) as fd:
        assert hostfs.remove_tree(fd, "6")
    assert (outside / "precious").exists()


def test_open_beneath_refuses_links_and_dot_dot(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "l").symlink_to(tmp_path / "a" / "b")
    with hostfs.opened(hostfs.open_dir(tmp_path)) as fd:
        os.close(hostfs.open_beneath(fd, "a/b"))
        with pytest.raises(hostfs.UnsafePath, match="'l' is a symlink"):
            hostfs.open_beneath(fd, "a/l")
        with pytest.raises(hostfs.UnsafePath):
            hostfs.open_beneath(fd, "a/../a")


# -- volumes shared by a project's jobs ---------------------------------------------------------


@needs_root
def test_a_projects_jobs_share_a_volume_and_other_projects_cannot_reach_it(
    runner: Runner,
) -> None:
    volume = runner.workdir / "volumes" / "v95"
    shared = {"project_id": 7, "volumes": [node_local(95)]}
    runner.start(assignment(101, 'id -G; umask; echo first > "$VOLUME_DATA/notes"', **shared))
    wait_for(lambda: 101 in exits(runner), runner)
    groups, umask = output(runner, 101).splitlines()[:2]
    assert str(GID_BASE + 7) in groups.split() and umask == "0007"
    st = volume.stat()
    assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, GID_BASE + 7, 0o2770)
    assert (volume / "notes").stat().st_gid == GID_BASE + 7  # setgid: the project's group
    # another job of the project (another uid) appends to it
    runner.start(assignment(102, 'echo second >> "$VOLUME_DATA/notes" && echo OK', **shared))
    wait_for(lambda: 102 in exits(runner), runner)
    assert "OK" in output(runner, 102)
    assert (volume / "notes").read_text() == "first\nsecond\n"
    # a job of another project reaches nothing of it on the host
    runner.start(assignment(103, f"cat {volume}/notes && echo GOT-IT", project_id=8))
    wait_for(lambda: 103 in exits(runner), runner)
    assert "GOT-IT" not in output(runner, 103)


# -- quotas and giving space back -----------------------------------------------------------------


def test_a_job_writing_past_its_volumes_limit_is_stopped_as_volume_full(workdir: Path) -> None:
    runner = make_runner(workdir, quota_interval_s=0.0)
    big = {"project_id": 3, "volumes": [node_local(96, name="out", limit_mib=1)]}
    runner.start(
        assignment(
            111, 'head -c 3000000 /dev/zero > "$VOLUME_OUT/blob"; echo wrote; sleep 30', **big
        )
    )
    wait_for(lambda: 111 in exits(runner), runner)
    body = exits(runner)[111]
    assert body["reason"] == "volume_full"
    assert "volume out is full (limit 1 MiB)" in body["message"]
    assert "volume_full" in EXIT_REASONS and FAILURE_TEXT["volume_full"] == "volume full"
    # under the limit (and with no limit): untouched
    small = {"project_id": 3, "volumes": [node_local(97, name="out", limit_mib=1)]}
    runner.start(
        assignment(112, 'head -c 1000 /dev/zero > "$VOLUME_OUT/small"; sleep 0.3', **small)
    )
    wait_for(lambda: 112 in exits(runner), runner)
    assert exits(runner)[112]["reason"] == "exited"


def test_usage_is_measured_without_following_links(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "huge").write_bytes(b"x" * 2_000_000)
    tree = tmp_path / "vol"
    tree.mkdir()
    (tree / "small").write_bytes(b"x" * 10_000)
    (tree / "link").symlink_to(outside)
    os.link(tree / "small", tree / "small-again")  # counted once
    os.mkfifo(tree / "fifo")  # never opened (it would block)
    (tree / "dev").symlink_to("/dev/zero")  # never opened (it would never end)
    with hostfs.opened(hostfs.open_dir(tree)) as fd:
        used = hostfs.tree_usage(fd)
    assert 10_000 <= used < 100_000


def test_scratch_goes_at_the_attempts_end_and_a_stopped_jobs_workspace_when_unassigned(
    runner: Runner,
) -> None:
    scratch = {
        "project_id": 2,
        "volumes": [{"id": 0, "name": "tmp", "kind": "scratch", "mount_path": "/tmp/s"}],
    }
    a = assignment(121, 'echo x > "$VOLUME_TMP/f"; echo w > kept; sleep 30', **scratch)
    runner.start(a)
    wait_for(lambda: (runner.workdir / "scratch" / "121" / "tmp" / "f").exists(), runner)
    runner.stop(a.key, "preempted", "preempt", grace_s=0)
    wait_for(lambda: 121 in exits(runner), runner)
    assert not (runner.workdir / "scratch" / "121").exists()
    assert (runner.workdir / "jobs" / "121").exists()  # it may come back here at once
    runner.release_workspaces({121})
    assert (runner.workdir / "jobs" / "121").exists()
    runner.release_workspaces(set())
    assert not (runner.workdir / "jobs" / "121").exists()


def test_the_sweep_removes_what_no_live_attempt_owns(workdir: Path, tmp_path: Path) -> None:
    runner = make_runner(workdir)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("x")
    for path in ("jobs/5/a", "scratch/5/tmp/b", "jobs/6/c"):
        (workdir / path).parent.mkdir(parents=True, exist_ok=True)
        (workdir / path).write_text("left by a crashed agent")
    (workdir / "jobs" / "6" / "out").symlink_to(outside)
    (workdir / "run" / "gpucloud-job-5-1.env").write_text("SECRET=x")
    live = runner.start(assignment(7, "sleep 30"))
    assert live.pid is not None
    removed = runner.sweep()
    assert sorted(removed) == ["jobs/5", "jobs/6", "run/gpucloud-job-5-1.env", "scratch/5"]
    assert (workdir / "jobs" / "7").exists() and (outside / "keep").exists()
    runner.stop_all("killed", "over", grace_s=0)
    runner.wait_all(5)


def test_a_deleted_node_local_volume_is_removed_unless_in_use(runner: Runner) -> None:
    busy = {"project_id": 2, "volumes": [node_local(97)]}
    runner.start(assignment(131, "sleep 30", **busy))
    (runner.workdir / "volumes" / "v98").mkdir()
    (runner.workdir / "volumes" / "v98" / "f").write_text("x")
    assert runner.remove_volumes([97, 98, 99]) == [98]
    assert (runner.workdir / "volumes" / "v97").exists()
    assert not (runner.workdir / "volumes" / "v98").exists()


def test_the_agents_directories_are_its_own(workdir: Path) -> None:
    (workdir / "run").mkdir(parents=True)
    os.chmod(workdir / "run", 0o777)  # a mode from before: taken back
    Storage(workdir).ensure_layout()
    assert stat.S_IMODE((workdir / "run").stat().st_mode) == 0o700
    for name in ("jobs", "scratch", "volumes"):
        assert stat.S_IMODE((workdir / name).stat().st_mode) == 0o711
    with pytest.raises(StorageError, match="no AGENT_SHARED_ROOT"):
        Storage(workdir).plan(
            assignment(1, project_id=1, volumes=[{**node_local(3), "kind": "shared"}])
        )


@needs_root
def test_a_workdir_someone_else_owns_is_refused(tmp_path: Path) -> None:
    """Its owner could swap jobs/ or run/ for links to anywhere."""
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    os.chown(theirs, 1234, 1234)
    with pytest.raises(StorageError, match="is not the agent's own"):
        Storage(theirs).ensure_layout()
    assert list(theirs.iterdir()) == []


def test_shared_volumes_live_under_the_shared_root(workdir: Path, tmp_path: Path) -> None:
    shared_root = tmp_path / "shared"
    shared_root.mkdir()
    runner = make_runner(workdir, shared_root=shared_root)
    vol = {"id": 12, "name": "ds", "kind": "shared", "mount_path": "/data/ds", "read_only": True}
    runner.start(assignment(141, 'echo "$VOLUME_DS"', project_id=2, volumes=[vol]))
    wait_for(lambda: 141 in exits(runner), runner)
    assert output(runner, 141).strip() == str(shared_root / "v12")
    assert (shared_root / "v12").is_dir()


# -- the container runtime: mounts, groups, the env file -------------------------------------------


@pytest.fixture
def containers(workdir: Path) -> Iterator[Runner]:
    runtime = ContainerRuntime(
        default_image=IMAGE, agent_source=agent_source_root(), node_label="unit-test-storage"
    )
    r = make_runner(workdir, runtime)
    yield r
    r.stop_all("killed", "test over", grace_s=0)
    r.wait_all(20)


@needs_engine
def test_a_container_sees_its_volumes_read_only_where_asked_and_its_env_file_goes(
    containers: Runner,
) -> None:
    vols = [node_local(150, name="rw"), node_local(151, name="ro", read_only=True)]
    (containers.workdir / "volumes" / "v151").mkdir()
    (containers.workdir / "volumes" / "v151" / "dataset.txt").write_text("data\n")
    command = (
        "id -G; umask; pwd; echo $CHECKPOINT_DIR; "
        "echo w > /data/rw/out && echo RW-OK; "
        "cat /data/ro/dataset.txt; echo x > /data/ro/x || echo RO-REFUSED; "
        "sleep 30"
    )
    job = containers.start(
        assignment(
            152,
            command,
            project_id=9,
            volumes=vols,
            checkpoint={"volume": "rw", "path": "ck"},
            working_dir="/data/rw",
            env={"SECRET": "s3cr3t"},
        )
    )
    assert job.launch is not None
    env_file = Path(job.launch.extra["env_file"])
    assert env_file.parent == containers.workdir / "run"
    wait_for(lambda: "RO-REFUSED" in output(containers, 152), containers, timeout=60)
    wait_for(lambda: not env_file.exists(), containers)  # gone while the job still runs
    assert job.alive
    lines = output(containers, 152).splitlines()
    assert str(GID_BASE + 9) in lines[0].split() and lines[1] == "0007"
    assert lines[2] == "/data/rw" and lines[3] == "/data/rw/ck"
    assert "RW-OK" in lines and "data" in lines
    assert (containers.workdir / "volumes" / "v150" / "out").read_text() == "w\n"
    assert not (containers.workdir / "volumes" / "v151" / "x").exists()


@needs_engine
def test_a_container_job_naming_host_paths_gets_only_its_workspace(containers: Runner) -> None:
    before = fingerprint(Path("/root"))
    containers.start(
        assignment(
            153,
            "pwd; ls /workspace; echo x > /workspace/mine && echo OK",
            working_dir="/root",
            checkpoint_dir="/root",
            env={"CHECKPOINT_DIR": "/root"},
        )
    )
    wait_for(lambda: 153 in exits(containers), containers, timeout=60)
    assert "OK" in output(containers, 153)
    assert fingerprint(Path("/root")) == before
    assert not (HOST_ROOT / "mine").exists()


def test_the_process_runtime_path_is_honest_about_read_only(runner: Runner) -> None:
    """No mount namespace: the process runtime cannot make a volume read-only (documented in
    docs/storage.md); it still runs the job and tells it where its volumes are."""
    ro = {"project_id": 2, "volumes": [node_local(160, name="ro", read_only=True)]}
    runner.start(assignment(161, 'echo "$VOLUME_RO"', **ro))
    wait_for(lambda: 161 in exits(runner), runner)
    assert output(runner, 161).strip() == str(runner.workdir / "volumes" / "v160")


# -- limits the kernel enforces: a loop-mounted image per volume ------------------------------------

needs_loop = pytest.mark.skipif(
    loopfs.available() is not None, reason=f"no volume images here: {loopfs.available()}"
)


@needs_loop
def test_a_node_local_volume_with_a_limit_is_an_image_the_kernel_holds_to_it(
    runner: Runner,
) -> None:
    volume = runner.workdir / "volumes" / "v170"
    limited = {"project_id": 5, "volumes": [node_local(170, limit_mib=16)]}
    try:
        runner.start(
            assignment(
                171,
                'head -c 40000000 /dev/zero > "$VOLUME_DATA/blob" || echo REFUSED; '
                'echo "size=$(stat -c %s "$VOLUME_DATA/blob")"',
                **limited,
            )
        )
        wait_for(lambda: 171 in exits(runner), runner, timeout=30)
        assert os.path.ismount(volume)
        text = output(runner, 171)
        assert "No space left on device" in text and "REFUSED" in text
        (size,) = [line[5:] for line in text.splitlines() if line.startswith("size=")]
        assert 0 < int(size) <= 16 * 1024 * 1024
        st = volume.stat()
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (0, GID_BASE + 5, 0o2770)
        assert not (volume / "lost+found").exists()
        # deleted in the portal: unmounted, its files and its image gone
        assert runner.remove_volumes([170]) == [170]
        assert not volume.exists()
        assert not (runner.workdir / "images" / "v170.img").exists()
    finally:
        loopfs.unmount(volume)


@needs_loop
def test_a_scratch_image_goes_with_its_attempt(runner: Runner) -> None:
    scratch = {
        "project_id": 5,
        "volumes": [
            {"id": 0, "name": "tmp", "kind": "scratch", "mount_path": "/s", "limit_mib": 16}
        ],
    }
    mountpoint = runner.workdir / "scratch" / "181" / "tmp"
    try:
        runner.start(assignment(181, 'echo x > "$VOLUME_TMP/f"; sleep 30', **scratch))
        wait_for(lambda: (mountpoint / "f").exists(), runner)
        assert os.path.ismount(mountpoint)
        runner.stop((181, 1), "cancelled", "cancel", grace_s=0)
        wait_for(lambda: 181 in exits(runner), runner)
        assert not os.path.ismount(mountpoint) and not mountpoint.parent.exists()
        assert not list((runner.workdir / "images").iterdir())
    finally:
        loopfs.unmount(mountpoint)


@needs_engine
def test_a_container_jobs_planted_stop_file_link_does_not_redirect_the_agents_write(
    containers: Runner, tmp_path: Path
) -> None:
    """The link's target is read by the agent on the host, not in the container."""
    outside = tmp_path / "host-file"
    outside.write_text("the host's\n")
    a = assignment(
        191,
        f'ln -s {outside} "$CHECKPOINT_DIR/{STOP_FILE}"; echo planted; sleep 60',
        project_id=4,
        volumes=[node_local(190, name="ckpt")],
        checkpoint={"volume": "ckpt", "path": "runs"},
        grace_seconds=5,
    )
    containers.start(a)
    wait_for(lambda: "planted" in output(containers, 191), containers, timeout=60)
    link = containers.workdir / "volumes" / "v190" / "runs" / STOP_FILE
    assert link.is_symlink()
    containers.stop(a.key, "preempted", "preempt", request="preempt")
    wait_for(lambda: 191 in exits(containers), containers, timeout=30)
    assert outside.read_text() == "the host's\n"
    assert not link.is_symlink() and json.loads(link.read_text())["reason"] == "preempt"
