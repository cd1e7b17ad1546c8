"""`simulate` shows its progress (done / total, ETA) and stops cleanly on Ctrl-C with the
partial result."""

from __future__ import annotations

import io
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from scheduler.core.cli import ProgressBar, format_eta, main
from scheduler.core.queueing import simulate_queue
from scheduler.core.traces import JobRow

ROOT = Path(__file__).resolve().parents[2]


def _jobs(n: int, seed: int = 1) -> list[JobRow]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for _ in range(n):
        t += rng.expovariate(1 / 30)
        out.append(
            JobRow(
                submit_s=t, duration_s=rng.uniform(60, 3600), gpus=rng.choice([1, 2, 4]), cluster=""
            )
        )
    return out


def _write_trace(path: Path, jobs: list[JobRow]) -> None:
    lines = ["timestamp,duration,num_gpus"]
    lines += [f"{j.submit_s:.1f},{j.duration_s:.1f},{j.gpus}" for j in jobs]
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("policy", ["backfill", "oracle-srtf"])
def test_progress_counts_finished_jobs_up_to_the_total(policy: str) -> None:
    seen: list[tuple[int, int]] = []
    result = simulate_queue(_jobs(120), 16, 8, policy, progress=lambda d, t: seen.append((d, t)))
    assert not result.interrupted and result.jobs == result.total == 120
    assert seen[-1] == (120, 120)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)  # never goes back
    assert len(seen) > 10


@pytest.mark.parametrize("policy", ["backfill", "oracle-srtf"])
def test_an_interrupt_returns_the_partial_result(policy: str) -> None:
    def stop_halfway(done: int, total: int) -> None:
        if done >= total // 2:
            raise KeyboardInterrupt

    result = simulate_queue(_jobs(120), 16, 8, policy, progress=stop_halfway)
    assert result.interrupted and result.total == 120
    assert 60 <= result.jobs < 120
    assert result.avg_jct > 0 and result.makespan > 0


def test_the_bar_says_done_total_percent_and_eta() -> None:
    now = [100.0]
    out = io.StringIO()
    bar = ProgressBar(out, unit="jobs", clock=lambda: now[0], width=10, every=0.5)
    bar(0, 3000)
    now[0] = 110.0  # 10 s for 1,000 of 3,000: 20 s to go
    bar(1000, 3000)
    now[0] = 110.1  # too soon to redraw
    bar(1001, 3000)
    bar.close()
    lines = out.getvalue().split("\r")
    assert lines[-1] == "[###.......] 1,000/3,000 jobs   33%  ETA 20s\n"
    assert "ETA --" in lines[1]
    assert [format_eta(s) for s in (5, 75, 3725)] == ["5s", "1m15s", "1h02m"]


def test_cli_draws_the_bar_when_asked(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    _write_trace(trace, _jobs(60))
    out, err = io.StringIO(), io.StringIO()
    rc = main(
        ["queue", "--jobs", str(trace), "--gpus", "16", "--progress", "always"], out=out, err=err
    )
    assert rc == 0
    assert "60/60 jobs" in err.getvalue() and "ETA" in err.getvalue()
    assert out.getvalue().splitlines()[0].split()[:2] == ["policy", "jobs"]
    quiet = io.StringIO()
    main(["queue", "--jobs", str(trace), "--gpus", "16"], out=io.StringIO(), err=quiet)
    assert quiet.getvalue() == ""  # not a terminal: no bar


def test_ctrl_c_stops_a_long_run_with_the_partial_result(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    _write_trace(trace, _jobs(3000, seed=7))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scheduler.core.cli",
            "queue",
            "--jobs",
            str(trace),
            "--gpus",
            "64",
            "--progress",
            "always",
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        # as from a terminal: a suite started in the background inherits SIGINT ignored, and
        # Python then never turns it into KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert proc.stderr is not None
    seen = b""
    while b"ETA" not in seen or b"/3,000 jobs" not in seen:  # the bar is up and counting
        chunk = proc.stderr.read1(4096)  # type: ignore[attr-defined]
        assert chunk, "the run ended before it drew its progress"
        seen += chunk
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130
    header, row = stdout.decode().splitlines()
    assert header.split()[:2] == ["policy", "jobs"]
    finished = int(row.split()[1])
    assert 0 < finished < 3000
    assert f"partial result over the {finished:,} of 3,000 jobs" in stderr.decode()
    assert "Traceback" not in stderr.decode()
