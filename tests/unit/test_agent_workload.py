"""The demo workload: progress lines, checkpoints, resume, a clean exit on SIGTERM, --fail-at."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def workload(ckpt: Path, *args: str, resume: bool = False) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CHECKPOINT_DIR": str(ckpt),
        "RESUME": "1" if resume else "0",
    }
    return subprocess.Popen(
        [sys.executable, "-m", "agent.workload", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_runs_to_the_end_and_leaves_a_checkpoint(tmp_path: Path) -> None:
    proc = workload(
        tmp_path, "--seconds", "0.3", "--step-seconds", "0.05", "--checkpoint-every", "0.1"
    )
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 0
    lines = out.splitlines()
    assert lines[0].startswith("step 1/6 loss ") and lines[-1].startswith("done: 6 steps")
    losses = [float(line.split()[-1]) for line in lines if line.startswith("step ")]
    assert losses[-1] < losses[0]  # it "learns"
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] == 6
    assert "6 steps" in err


def test_sigterm_saves_a_checkpoint_and_exits_143_then_resume_continues(tmp_path: Path) -> None:
    proc = workload(
        tmp_path, "--seconds", "30", "--step-seconds", "0.02", "--checkpoint-every", "60"
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("step 5/"):
            break
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 143
    assert "SIGTERM: checkpoint saved" in out
    step = json.loads((tmp_path / "checkpoint.json").read_text())["step"]
    assert step >= 5

    resumed = workload(tmp_path, "--seconds", "0.2", "--step-seconds", "0.01", resume=True)
    out, _ = resumed.communicate(timeout=10)
    assert out.splitlines()[0] == f"resumed from checkpoint at step {step}"
    assert resumed.returncode == 0


def test_fail_at_exits_1(tmp_path: Path) -> None:
    proc = workload(tmp_path, "--seconds", "10", "--step-seconds", "0.01", "--fail-at", "3")
    out, err = proc.communicate(timeout=10)
    assert proc.returncode == 1
    assert out.splitlines()[-1].startswith("step 3/") and "failing at step 3" in err


def test_the_checkpoint_signal_file_stops_a_workload_that_ignores_sigterm(tmp_path: Path) -> None:
    from agent import protocol
    from agent import workload as demo

    assert demo.STOP_FILE == protocol.STOP_FILE  # the workload imports nothing of the agent
    proc = workload(
        tmp_path,
        "--seconds",
        "30",
        "--step-seconds",
        "0.02",
        "--checkpoint-every",
        "60",
        "--ignore-sigterm",
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().startswith("step 1/")
    proc.send_signal(signal.SIGTERM)  # ignored: it keeps stepping
    assert proc.stdout.readline().startswith("step ")
    (tmp_path / protocol.STOP_FILE).write_text('{"reason": "preempt"}')
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 143
    assert "stop requested (preempt): checkpoint saved at step" in out
    assert json.loads((tmp_path / "checkpoint.json").read_text())["step"] > 1
