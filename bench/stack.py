"""A production-like local stack for benchmarks: gunicorn, a Celery worker and beat on a bench
database, plus in-process simulated agents. PostgreSQL and Redis are the configured ones."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

import requests

from bench import REPO

MACHINE = "whole machine"


def cpu_seconds(groups: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process group, PostgreSQL's and Redis's processes,
    this process (from /proc), and the whole machine (`MACHINE`, from /proc/stat): what the
    named parts do not account for (job processes, the kernel, anything else) is the gap."""
    tick = os.sysconf("SC_CLK_TCK")
    by_group = {pgid: name for name, pgid in groups.items()}
    out: dict[str, float] = defaultdict(float)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        comm = raw[raw.index("(") + 1 : raw.rindex(")")]
        fields = raw[raw.rindex(")") + 2 :].split()
        # own time plus that of its children already reaped (a PostgreSQL backend that
        # ended is counted in the postmaster's), so every CPU second is counted once
        pgid, used = int(fields[2]), sum(int(f) for f in fields[11:15]) / tick
        if int(entry.name) == os.getpid():
            out["load generator (this process)"] += used
        elif pgid in by_group:
            out[by_group[pgid]] += used
        elif comm.startswith("postgres"):
            out["PostgreSQL"] += used
        elif comm.startswith("redis"):
            out["Redis"] += used
    # user, nice, system, (idle, iowait skipped), irq, softirq, steal
    busy = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    out[MACHINE] = sum(int(busy[i]) for i in (0, 1, 2, 5, 6, 7)) / tick
    return out


def cpu_table(before: dict[str, float], after: dict[str, float], seconds: float) -> list[list[str]]:
    """Rows (part, CPU seconds, cores used) for the window between two `cpu_seconds` readings,
    with what the named parts leave of the machine's total as a row of its own."""
    used = {name: after[name] - before.get(name, 0.0) for name in after}
    machine = used.pop(MACHINE)
    rows = [
        [name, f"{used[name]:.1f}", f"{used[name] / seconds:.2f}"]
        for name in sorted(used, key=lambda n: -used[n])
    ]
    rest = max(0.0, machine - sum(used.values()))
    rows.append(["everything else (job processes, kernel)", f"{rest:.1f}", f"{rest / seconds:.2f}"])
    rows.append([f"**{MACHINE}**", f"{machine:.1f}", f"{machine / seconds:.2f}"])
    return rows


def wait_port(url: str, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            requests.get(url + "/login/", timeout=1)
            return
        except requests.RequestException:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


class Stack:
    """Start with `start()`, add agents with `agents()`, always `stop()`."""

    def __init__(self, db_url: str, port: int, web_workers: int, queues: str) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "SCHEDULER_CYCLE_SECONDS": "1",
            "NODE_HEARTBEAT_SECONDS": "5",
            "AGENT_POLL_SECONDS": "1",
            "DB_CONN_MAX_AGE": "60",  # as in production: persistent connections
            # One bench user submits for everyone: per-user limits (20 submits/s by default) must
            # not be what is measured.
            "RATE_SUBMIT": "60000/min",
            "RATE_USER": "60000/min",
        }
        self.port, self.web_workers, self.queues = port, web_workers, queues
        self.access_log: Path | None = None  # set before start() to count requests served
        self.procs: list[subprocess.Popen[bytes]] = []
        self.swarms: list[subprocess.Popen[bytes]] = []
        self.stop_agents = threading.Event()
        self.agent_threads: list[threading.Thread] = []

    def _spawn(self, *args: str) -> None:
        self.procs.append(
            subprocess.Popen(
                [sys.executable, "-m", *args], cwd=REPO, env=self.env, start_new_session=True
            )
        )

    def start(self) -> None:
        self._spawn(
            "gunicorn",
            "config.wsgi",
            "-b",
            f"127.0.0.1:{self.port}",
            "-w",
            str(self.web_workers),
            "--threads",
            "4",
            "--log-level",
            "warning",
            *(("--access-logfile", str(self.access_log)) if self.access_log else ()),
        )
        self._spawn(
            "celery",
            "-A",
            "config",
            "worker",
            "-Q",
            self.queues,
            "--pool",
            "threads",
            "-c",
            "2",
            "--loglevel",
            "WARNING",
        )
        beat_file = Path(tempfile.mkdtemp(prefix="bench-beat-")) / "schedule"
        self._spawn(
            "celery", "-A", "config", "beat", "--loglevel", "WARNING", "--schedule", str(beat_file)
        )
        wait_port(self.url, timeout=180)  # three workers importing Django on a busy machine

    def agents(
        self, tokens: dict[str, str], gpus: str = "8xH100-80GB-SXM", poll_s: float = 1.0
    ) -> None:
        from agent.config import Config
        from agent.main import Agent

        workroot = Path(tempfile.mkdtemp(prefix="bench-agents-"))
        for name, token in tokens.items():
            config = Config(
                portal_url=self.url,
                token=token,
                workdir=workroot / name,
                simulate=True,
                runtime="process",  # jobs here are trivial commands; no image
                sim_gpus=gpus,
                hostname=name,
                poll_interval_s=poll_s,
                heartbeat_interval_s=5,
            )
            threading.Thread(
                target=Agent(config).run, args=(self.stop_agents,), daemon=True
            ).start()

    def swarm(
        self,
        tokens: dict[str, str],
        processes: int,
        poll_s: float | None = None,
        heartbeat_s: float | None = None,
        ramp_s: float = 0.0,
    ) -> None:
        """The agents in `processes` separate processes (`bench.agent_swarm`), not in this one,
        started evenly over `ramp_s` seconds (a fleet does not boot in the same second)."""
        folder = Path(tempfile.mkdtemp(prefix="bench-swarm-tokens-"))
        names = sorted(tokens)
        for k in range(processes):
            part = {name: tokens[name] for name in names[k::processes]}
            path = folder / f"tokens-{k}.json"
            path.write_text(json.dumps(part), encoding="utf-8")
            args = [sys.executable, "-m", "bench.agent_swarm", str(path), "--portal", self.url]
            if poll_s is not None:
                args += ["--poll", str(poll_s)]
            if heartbeat_s is not None:
                args += ["--heartbeat", str(heartbeat_s)]
            args += ["--ramp", str(ramp_s)]
            self.swarms.append(
                subprocess.Popen(args, cwd=REPO, env=self.env, start_new_session=True)
            )

    def stop(self) -> None:
        for p in self.swarms:  # agents stop their work and report it while web is up
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGTERM)
        for p in self.swarms:
            try:
                p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
        self.stop_agents.set()
        for thread in self.agent_threads:  # they stop their work and report it while web is up
            thread.join(timeout=40)
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
