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
# What the load benchmark reads from gunicorn's access logs: the request line, the status, the
# answer's size, the request body's size and the time the worker took (ms), so that agent
# syncs can be told apart (idle or carrying reports) and each class gets server-side latency.
ACCESS_LOG_FORMAT = '%(h)s %(t)s "%(r)s" %(s)s %(B)s %({content-length}i)s %(M)s'


def private_redis() -> tuple[str, subprocess.Popen[bytes]]:
    """A Redis server of the benchmark's own (no persistence, a free port), so that Redis's CPU
    time is the benchmark's alone on a machine whose shared server others use. Returns its URL
    and process (terminate it when done)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    proc = subprocess.Popen(
        [
            *("redis-server", "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--loglevel", "warning"),
        ],
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    deadline = time.time() + 10
    while time.time() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return f"redis://127.0.0.1:{port}/0", proc
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("redis-server did not come up")


def database_backends(dbname: str) -> set[int]:
    """PostgreSQL backends now connected to `dbname` (the server may serve others' work too)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s", [dbname])
        return {row[0] for row in cur.fetchall()}


def cpu_seconds(
    groups: dict[str, int], pg_backends: set[int] | None = None, redis_pids: set[int] | None = None
) -> dict[str, float]:
    """CPU seconds so far of each named process group, PostgreSQL's and Redis's processes,
    this process (from /proc), and the whole machine (`MACHINE`, from /proc/stat): what the
    named parts do not account for (job processes, the kernel, anything else) is the gap.
    With `pg_backends` (`database_backends`), PostgreSQL is only those backends (on a server
    others use too), the rest of its processes counted apart; with `redis_pids`, Redis is only
    those servers (`private_redis`)."""
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
            if pg_backends is None or int(entry.name) in pg_backends:
                out["PostgreSQL"] += used
            else:
                out["PostgreSQL, other databases and its own processes"] += used
        elif comm.startswith("redis"):
            if redis_pids is None or int(entry.name) in redis_pids:
                out["Redis"] += used
            else:
                out["Redis, the shared server"] += used
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


def wait_port(url: str, timeout: float = 30, probe: str = "/login/") -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            requests.get(url + probe, timeout=1)
            return
        except requests.RequestException:
            time.sleep(0.2)
    raise SystemExit(f"{url} did not come up")


class Stack:
    """Start with `start()`, add agents with `agents()`, always `stop()`.

    With `agent_workers`, the agent API runs as deployed: its own gunicorn pool
    (`config.wsgi_agent` with `deploy/gunicorn_agent.py`, on `port + 1`) that the agents talk
    to (`agent_url`), so user traffic on the web pool cannot queue in front of heartbeats.
    Without, the web pool serves the agents too (`agent_url` is `url`).

    With `events`, the events service runs as deployed (`config.asgi_events`, uvicorn, on
    `port + 2`: `events_url`) and the agents watch their assignments there (agent/watch.py),
    polling only as a fallback; without, they poll."""

    def __init__(
        self,
        db_url: str,
        port: int,
        web_workers: int,
        queues: str,
        *,
        agent_workers: int = 0,
        agent_threads: int = 4,
        events: bool = False,
    ) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.agent_workers, self.agent_pool_threads = agent_workers, agent_threads
        self.agent_url = f"http://127.0.0.1:{port + 1}" if agent_workers else self.url
        self.events_url = f"http://127.0.0.1:{port + 2}" if events else ""
        self.events: subprocess.Popen[bytes] | None = None
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
        self.agent_access_log: Path | None = None  # the agent pool's, likewise
        self.task_meter: Path | None = None  # set before start(): each task's CPU (worker_meter)
        self.agent_pool: subprocess.Popen[bytes] | None = None
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
            *(
                ("--access-logfile", str(self.access_log), "--access-logformat", ACCESS_LOG_FORMAT)
                if self.access_log
                else ()
            ),
        )
        if self.task_meter:
            self.env["TASK_METER_FILE"] = str(self.task_meter)
        self._spawn(
            "celery",
            "-A",
            "bench.worker_meter" if self.task_meter else "config",
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
        if self.agent_workers:
            log = self.agent_access_log
            self._spawn(
                *(
                    "gunicorn",
                    "-c",
                    str(REPO / "deploy" / "gunicorn_agent.py"),
                    "config.wsgi_agent",
                ),
                *("-b", self.agent_url.removeprefix("http://")),
                *("-w", str(self.agent_workers), "--threads", str(self.agent_pool_threads)),
                *("--log-level", "warning", "--error-logfile", "-"),
                *(
                    ("--access-logfile", str(log), "--access-logformat", ACCESS_LOG_FORMAT)
                    if log
                    else ("--access-logfile", "/dev/null")
                ),
            )
            self.agent_pool = self.procs[-1]
        if self.events_url:
            self._spawn(
                *("gunicorn", "-c", str(REPO / "deploy" / "gunicorn_events.py")),
                "config.asgi_events",
                *("-b", self.events_url.removeprefix("http://"), "-w", "1"),
                *("--log-level", "warning", "--access-logfile", "/dev/null"),
            )
            self.events = self.procs[-1]
        wait_port(self.url, timeout=180)  # three workers importing Django on a busy machine
        if self.agent_workers:
            wait_port(self.agent_url, timeout=180, probe="/healthz")
        if self.events_url:
            wait_port(self.events_url, timeout=180, probe="/healthz")

    def agents(
        self, tokens: dict[str, str], gpus: str = "8xH100-80GB-SXM", poll_s: float = 1.0
    ) -> None:
        from agent.config import Config
        from agent.main import Agent

        workroot = Path(tempfile.mkdtemp(prefix="bench-agents-"))
        for name, token in tokens.items():
            config = Config(
                portal_url=self.agent_url,
                token=token,
                workdir=workroot / name,
                simulate=True,
                runtime="process",  # jobs here are trivial commands; no image
                sim_gpus=gpus,
                hostname=name,
                poll_interval_s=poll_s,
                heartbeat_interval_s=5,
                watch=bool(self.events_url),
                events_url=self.events_url,
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
        stats: Path | None = None,
    ) -> None:
        """The agents in `processes` separate processes (`bench.agent_swarm`), not in this one,
        started evenly over `ramp_s` seconds (a fleet does not boot in the same second). With
        `stats` (a folder), each process times its agents' exchanges and writes
        `stats/swarm-K.json` when stopped, counting from when `stats/mark` appears."""
        folder = Path(tempfile.mkdtemp(prefix="bench-swarm-tokens-"))
        names = sorted(tokens)
        for k in range(processes):
            part = {name: tokens[name] for name in names[k::processes]}
            path = folder / f"tokens-{k}.json"
            path.write_text(json.dumps(part), encoding="utf-8")
            args = [
                sys.executable,
                "-m",
                "bench.agent_swarm",
                str(path),
                "--portal",
                self.agent_url,
            ]
            if poll_s is not None:
                args += ["--poll", str(poll_s)]
            if heartbeat_s is not None:
                args += ["--heartbeat", str(heartbeat_s)]
            if self.events_url:
                args += ["--events", self.events_url]
            args += ["--ramp", str(ramp_s)]
            if stats is not None:
                args += ["--stats", str(stats / f"swarm-{k}.json"), "--mark", str(stats / "mark")]
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
