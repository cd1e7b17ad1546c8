"""The running system for end-to-end tests: live server, a real Celery worker, and node agents
started as real processes (`python -m agent`, simulated GPUs) speaking HTTP to the server."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent


class Agents:
    def __init__(self, url: str, workdir: Path) -> None:
        self.url = url
        self.workdir = workdir
        # The shared storage of the pool: one directory every simulated node mounts at the same
        # path (in production an NFS, Lustre or CephFS mount on each node; docs/storage.md).
        self.shared_root = workdir / "shared"
        self.shared_root.mkdir(mode=0o755, exist_ok=True)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, token: str, gpus: str, **extra: str) -> subprocess.Popen[bytes]:
        """An agent as a process; the process runtime on the agent's uid unless `extra`
        (environment variables) says otherwise."""
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("DATABASE_", "REDIS_", "DJANGO_"))
        }
        env.update(
            PORTAL_URL=self.url,
            NODE_TOKEN=token,
            AGENT_SIMULATE="1",
            AGENT_SIM_GPUS=gpus,
            AGENT_HOSTNAME=name,
            AGENT_WORKDIR=str(self.workdir / name),
            AGENT_HEARTBEAT_INTERVAL="1",
            AGENT_POLL_INTERVAL="0.3",
            AGENT_DEFAULT_GRACE="5",
            AGENT_RUNTIME="process",
            AGENT_JOB_UID_BASE="0",
            AGENT_SHARED_ROOT=str(self.shared_root),
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs[name] = proc
        return proc

    def stop(self, name: str, *, kill: bool = False) -> None:
        proc = self.procs.pop(name)
        if kill:
            proc.kill()
        else:
            proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def log(self, name: str) -> str:
        return (self.workdir / f"{name}.log").read_text(errors="replace")

    def stop_all(self) -> None:
        for name in list(self.procs):
            self.stop(name)


# These agents heartbeat every 1 s and poll every 0.3 s (AGENT_HEARTBEAT_INTERVAL,
# AGENT_POLL_INTERVAL above), faster than the intervals the portal gives agents: their per-node
# allowance is what they need, times the same margin (config/settings/base.py).
FAST_AGENT_RATES = {
    "RATE_AGENT_HEARTBEAT": f"{60 * 4}/min",
    "RATE_AGENT": f"{int(2 * 60 / 0.3) * 4}/min",
}


@pytest.fixture
def agents(live_server, monkeypatch, settings) -> Iterator[Agents]:
    from scheduler.agent_api.views import AgentThrottle

    rates = AgentThrottle.THROTTLE_RATES  # DRF's, shared by every throttle class
    monkeypatch.setitem(rates, "agent_heartbeat", FAST_AGENT_RATES["RATE_AGENT_HEARTBEAT"])
    monkeypatch.setitem(rates, "agent", FAST_AGENT_RATES["RATE_AGENT"])
    with tempfile.TemporaryDirectory(prefix="agents-") as tmp:
        pool = Agents(live_server.url, Path(tmp))
        settings.STORAGE_SHARED_ROOT = str(pool.shared_root)  # the portal sees the same files
        try:
            yield pool
        finally:
            pool.stop_all()
            for log in sorted(Path(tmp).glob("*.log")):  # shown by pytest when a test fails
                print(f"--- {log.name} ---\n{log.read_text(errors='replace')[-4000:]}")


def wait_for_registration(names: list[str], timeout: float = 30) -> None:
    """Until every named node's agent has registered its inventory (its GPUs are then the
    agent's, not the fixture's) and heartbeated."""
    from portal.models import AuditEvent
    from scheduler.models import Node
    from tests.polling import wait_for

    ids = {str(pk) for pk in Node.objects.filter(name__in=names).values_list("pk", flat=True)}

    def registered() -> bool:
        done = set(
            AuditEvent.objects.filter(action="node.register", target_id__in=ids).values_list(
                "target_id", flat=True
            )
        )
        beating = Node.objects.filter(name__in=names, last_heartbeat_at__isnull=False).count()
        return done == ids and beating == len(names)

    wait_for(registered, timeout=timeout)


class Web:
    """The portal as its own gunicorn process on the test database, so it can be restarted."""

    def __init__(
        self,
        log: Path,
        *,
        app: str = "config.wsgi",
        workers: int = 1,
        threads: int = 4,
        probe: str = "/login/",
        worker_class: str = "",
        **env: str,
    ) -> None:
        self.app, self.workers, self.threads, self.probe = app, workers, threads, probe
        self.worker_class = worker_class  # e.g. the events service's uvicorn worker
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        from django.db import connection

        db = connection.settings_dict
        self.env = {
            **os.environ,
            "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            **FAST_AGENT_RATES,
            **env,
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "gunicorn",
                    self.app,
                    "-b",
                    f"127.0.0.1:{self.port}",
                    "-w",
                    str(self.workers),
                    "--threads",
                    str(self.threads),
                    *(("-k", self.worker_class) if self.worker_class else ()),
                ],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        from tests.polling import wait_for

        def answers() -> bool:
            try:
                requests.get(self.url + self.probe, timeout=1)
            except requests.RequestException:
                return False
            return True

        wait_for(answers, timeout=30, interval=0.2)  # the portal started

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:  # streams still open past the graceful timeout
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
            self.proc = None
