"""The runner with real processes: logs, exit codes, process-group stops, env, leftovers."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.runner import Assignment, Message, Runner
from tests.polling import wait_for

UUID_A = "GPU-11111111-2222-3333-4444-555555555555"
UUID_B = "GPU-66666666-7777-8888-9999-000000000000"


def alive(pid: int) -> bool:
    """Running, not a zombie (a zombie is dead even when nobody has reaped it yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def assignment(job_id: int = 1, command: str = "true", **kw: Any) -> Assignment:
    return Assignment.from_dict(
        {"job_id": job_id, "attempt": 1, "action": "run", "command": command, **kw}
    )


def messages(runner: Runner, kind: str | None = None) -> list[Message]:
    return [m for m in runner.outbox if kind is None or m.kind == kind]


def logs_of(runner: Runner, stream: str) -> str:
    return "".join(m.body["text"] for m in messages(runner, "logs") if m.body["stream"] == stream)


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[Runner]:
    r = Runner(tmp_path / "work", base_env={"PATH": os.environ["PATH"], "NODE_TOKEN": "secret"})
    yield r
    r.stop_all("killed", "test over", grace_s=0)
    r.wait_all(5)


def run_to_end(runner: Runner, a: Assignment, timeout: float = 5.0) -> dict[str, Any]:
    runner.start(a)
    wait_for(lambda: not runner.jobs, timeout, 0.02, between=runner.poll)
    (exited,) = messages(runner, "exited")
    return exited.body


def test_runs_a_shell_command_and_collects_output_and_exit_code(runner: Runner) -> None:
    body = run_to_end(
        runner, assignment(command="echo hello; echo oops >&2; printf 'no newline'; exit 3")
    )
    assert body == {
        "attempt": 1,
        "exit_code": 3,
        "signal": None,
        "reason": "exited",
        "message": "exit code 3",
    }
    kinds = [m.kind for m in runner.outbox]
    assert kinds[0] == "started" and kinds[-1] == "exited" and set(kinds[1:-1]) == {"logs"}
    assert runner.outbox[0].body["pid"] > 0
    assert logs_of(runner, "stdout") == "hello\nno newline"
    assert logs_of(runner, "stderr") == "oops\n"
    seqs = [m.body["seq"] for m in messages(runner, "logs")]
    assert seqs == list(range(len(seqs)))  # one counter per attempt, from 0
    assert all(m.path == "/jobs/1/logs" for m in messages(runner, "logs"))
    assert runner.knows((1, 1))  # never started again


def test_big_output_is_cut_into_chunks_on_line_boundaries(runner: Runner) -> None:
    command = f"{sys.executable} -c \"import sys; [print('line %05d ' % i + 'x' * 90) for i in range(600)]\""
    body = run_to_end(runner, assignment(command=command))
    assert body["exit_code"] == 0
    chunks = [m.body["text"] for m in messages(runner, "logs")]
    assert len(chunks) >= 4
    assert all(len(c.encode()) <= 16 * 1024 for c in chunks)
    assert all(c.endswith("\n") for c in chunks)
    lines = "".join(chunks).splitlines()
    assert (
        len(lines) == 600
        and lines[0].startswith("line 00000")
        and lines[-1].startswith("line 00599")
    )


def test_logs_are_flushed_while_the_job_runs(runner: Runner) -> None:
    runner.start(assignment(command="echo early; sleep 30"))
    wait_for(lambda: bool(messages(runner, "logs")), 3.0, 0.02, between=runner.poll)
    assert logs_of(runner, "stdout") == "early\n"
    assert runner.jobs[(1, 1)].alive  # sent while it runs, not at its exit


def test_stop_terminates_the_whole_process_group(runner: Runner, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    runner.start(assignment(command=f"sleep 300 & echo $! > {pidfile}; wait", grace_seconds=10))
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    child = int(pidfile.read_text())
    leader = runner.jobs[(1, 1)].pid
    assert leader is not None and alive(child) and alive(leader)

    assert runner.stop((1, 1), "preempted", "preempted by the portal")
    # SIGTERM is enough: within the wait, well inside the 10 s grace (the exit says so below)
    wait_for(lambda: not runner.jobs, 5.0, 0.02, between=runner.poll)
    assert not alive(child) and not alive(leader)
    (exited,) = messages(runner, "exited")
    assert exited.body["reason"] == "preempted"
    assert exited.body["signal"] == signal.SIGTERM and exited.body["exit_code"] is None
    assert "ended after SIGTERM" in exited.body["message"]


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(runner: Runner, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    command = f"trap '' TERM; sleep 300 & echo $! > {pidfile}; wait; wait; wait"
    runner.start(assignment(command=command, grace_seconds=0.5))
    wait_for(lambda: pidfile.exists() and pidfile.read_text().strip() != "")
    child = int(pidfile.read_text())

    started = time.monotonic()
    runner.stop((1, 1), "cancelled", "cancelled by the user")
    wait_for(lambda: not runner.jobs, 5.0, 0.02, between=runner.poll)
    # SIGTERM is ignored, so the grace was waited out (a lower bound: load cannot make it pass
    # wrongly), and then SIGKILL ended the group.
    assert time.monotonic() - started >= 0.5
    assert not alive(child)
    (exited,) = messages(runner, "exited")
    assert exited.body["reason"] == "cancelled"
    assert exited.body["signal"] == signal.SIGKILL
    assert "SIGKILL after 0.5s grace" in exited.body["message"]


def test_background_leftovers_do_not_outlive_the_job(runner: Runner, tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    body = run_to_end(runner, assignment(command=f"sleep 300 & echo $! > {pidfile}; exit 0"))
    assert body["exit_code"] == 0 and body["reason"] == "exited"
    assert "leftover" in body["message"]
    assert not alive(int(pidfile.read_text()))


def test_job_env_fences_gpus_and_sets_mps_limits_for_a_share(runner: Runner) -> None:
    share = assignment(
        gpu_uuids=[UUID_A],
        share_milli=250,
        gpu_memory_limit_mib=20480,
        env={"JOB_ID": "1", "RESUME": "0", "CUDA_VISIBLE_DEVICES": "0,1,2,3"},
    )
    env = runner.job_env(share)
    assert env["CUDA_VISIBLE_DEVICES"] == UUID_A  # the job's own env cannot widen it
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert env["JOB_ID"] == "1" and env["RESUME"] == "0"
    assert "NODE_TOKEN" not in env  # the agent's secret stays with the agent

    whole = runner.job_env(assignment(gpu_uuids=[UUID_A, UUID_B], share_milli=1000))
    assert whole["CUDA_VISIBLE_DEVICES"] == f"{UUID_A},{UUID_B}"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in whole
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in whole

    no_limit = runner.job_env(assignment(gpu_uuids=[UUID_A], share_milli=500))
    assert no_limit["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in no_limit
    assert runner.job_env(assignment())["CUDA_VISIBLE_DEVICES"] == ""  # no GPUs: sees none


def test_the_process_really_gets_that_env_and_cwd(runner: Runner, tmp_path: Path) -> None:
    a = assignment(
        job_id=12,
        command='echo "$CUDA_VISIBLE_DEVICES|$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE|$SHARD_INDEX|$NODE_TOKEN|$PWD|$CHECKPOINT_DIR"',
        gpu_uuids=[UUID_B],
        share_milli=333,
        env={"SHARD_INDEX": "2", "CHECKPOINT_DIR": "/root"},  # a host path: dropped
        project_id=3,
        volumes=[{"id": 0, "name": "ckpt", "kind": "scratch", "mount_path": "/data/ckpt"}],
        checkpoint={"volume": "ckpt", "path": "runs/12"},
    )
    runner.start(a)
    wait_for(lambda: bool(logs_of(runner, "stdout")), 5.0, 0.02, between=runner.poll)
    devices, pct, shard, token, cwd, ckpt = logs_of(runner, "stdout").strip().split("|")
    assert (devices, pct, shard, token) == (UUID_B, "33", "2", "")
    assert Path(cwd) == runner.workdir / "jobs" / "12"
    # the process runtime: the checkpoint at its host path, inside the job's scratch volume
    assert Path(ckpt) == runner.workdir / "scratch" / "12" / "ckpt" / "runs" / "12"
    wait_for(lambda: not runner.jobs, 5.0, 0.02, between=runner.poll)
    (exited,) = messages(runner, "exited")
    assert exited.body["exit_code"] == 0
    # the job ended here: its workspace and its scratch are given back
    assert not (runner.workdir / "jobs" / "12").exists()
    assert not (runner.workdir / "scratch" / "12").exists()


def test_a_job_that_cannot_start_is_reported(runner: Runner, tmp_path: Path) -> None:
    job = runner.start(assignment(command="true", working_dir="/srv/../etc"))
    assert job.finished and not runner.jobs
    (exited,) = runner.outbox
    assert exited.kind == "exited"
    assert exited.body["reason"] == "failed_to_start"
    assert exited.body["exit_code"] is None
    assert "working_dir '/srv/../etc' is not a usable path" in exited.body["message"]


def test_forget_stops_the_attempt_and_reports_nothing_more(runner: Runner) -> None:
    runner.start(assignment(command="echo hi; sleep 30", grace_seconds=2))
    wait_for(lambda: bool(messages(runner, "started")), 3.0, 0.02, between=runner.poll)
    pid = runner.jobs[(1, 1)].pid
    assert pid is not None
    runner.forget((1, 1), "409 from the portal")
    assert not runner.outbox
    wait_for(lambda: not runner.jobs, 5.0, 0.02, between=runner.poll)
    assert not alive(pid)
    assert not runner.outbox  # no exit report for a forgotten attempt
    assert runner.knows((1, 1))


def test_a_restarted_agent_stops_what_a_crashed_one_left(tmp_path: Path) -> None:
    crashed = Runner(tmp_path / "work", base_env={"PATH": os.environ["PATH"]})
    job = crashed.start(assignment(job_id=5, command="sleep 300"))
    assert job.pid is not None and alive(job.pid)
    # The agent "crashes": its Runner is gone without stopping anything. A new one starts.
    fresh = Runner(tmp_path / "work", base_env={"PATH": os.environ["PATH"]})
    reports = fresh.kill_leftovers(grace_s=2)
    wait_for(lambda: not alive(job.pid))  # type: ignore[arg-type]
    assert [(m.job_id, m.kind, m.body["reason"]) for m in reports] == [(5, "exited", "killed")]
    assert list(fresh.outbox) == reports
    assert fresh.knows((5, 1))
    assert Runner(tmp_path / "work").kill_leftovers() == []  # nothing left the second time
    crashed.wait_all(2)


def test_assignment_parsing_rejects_garbage() -> None:
    a = Assignment.from_dict(
        {
            "job_id": "9",
            "attempt": 2,
            "action": "stop",
            "stop_reason": "preempt",
            "command": "x",
            "env": {"A": 1},
            "gpu_uuids": [UUID_A],
            "share_milli": 500,
            "gpu_memory_limit_mib": None,
            "working_dir": None,
            "checkpoint_dir": "/root",  # an old portal's host path: not even read
            "grace_seconds": 45,
        }
    )
    assert (a.job_id, a.attempt, a.action, a.stop_reason, a.grace_seconds) == (
        9,
        2,
        "stop",
        "preempt",
        45,
    )
    assert a.env == {"A": "1"}
    with pytest.raises(ValueError, match="malformed"):
        Assignment.from_dict({"attempt": 1})
    with pytest.raises(ValueError, match="unknown action"):
        Assignment.from_dict({"job_id": 1, "attempt": 1, "action": "explode"})
