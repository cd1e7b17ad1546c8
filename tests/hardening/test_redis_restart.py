"""Redis restarted (empty: it keeps nothing on disk) while jobs are queued and running.

The whole stack runs as processes against a throwaway Redis of its own: the portal (gunicorn),
a Celery worker, beat, and an agent. Broker messages, locks and the live cache die with Redis;
PostgreSQL is the source of truth, so after the restart beat's cycle picks up the queue again,
running work finishes, and nothing is lost or run twice.

The worker and beat run as the systemd units in deploy/ run them: restarted when they exit with a
failure (`Restart=on-failure`). Celery's worker can die on a broker loss: when the connection
drops while it is closing a channel, kombu's Redis transport fails with "Unrecoverable error:
AttributeError: 'NoneType' object has no attribute 'hostname'" (in `_connparams`, restoring
unacknowledged messages) and the worker exits 1 instead of reconnecting. Whether that happens
is a matter of timing; the deployment's answer is the restart, and so is this test's.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import threading
import time

import pytest
from rest_framework.test import APIClient

from portal.services import token_create
from scheduler.models import Job, JobState, Node
from tests.hardening.invariants import assert_invariants
from tests.polling import wait_for
from tests.stack_fixtures import ROOT, Agents, Web, wait_for_registration

pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


class Supervised:
    """A process started again whenever it exits with a failure, as `Restart=on-failure` with
    systemd's default `RestartSec` (100 ms) does, until `stop()`."""

    def __init__(self, argv: list[str], env: dict[str, str], log_path) -> None:
        self.argv, self.env, self.log_path = argv, env, log_path
        self.restarts = 0
        self._stopping = threading.Event()
        self.proc = self._start()
        self._watcher = threading.Thread(target=self._watch, daemon=True)
        self._watcher.start()

    def _start(self) -> subprocess.Popen[bytes]:
        with open(self.log_path, "ab") as out:
            return subprocess.Popen(
                self.argv,
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _watch(self) -> None:
        while not self._stopping.is_set():
            code = self.proc.wait()
            if self._stopping.is_set() or code == 0:
                return
            time.sleep(0.1)
            self.restarts += 1
            self.proc = self._start()

    def stop(self) -> None:
        self._stopping.set()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._watcher.join(timeout=5)


class Redis:
    def __init__(self, tmp) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed; `make test` installs it")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.tmp),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

        def answers() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5).close()
            except OSError:
                return False
            return True

        wait_for(answers, timeout=10)  # redis-server started

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


def test_redis_restart_while_jobs_are_queued_and_running(team, fleet, tmp_path):
    Node.objects.exclude(name="h1").update(state=Node.State.CORDONED)
    redis = Redis(tmp_path)
    redis.start()
    env = {"REDIS_URL": redis.url, "SCHEDULER_CYCLE_SECONDS": "1", "TEST_RUN_ID": "redis-fault"}
    web = Web(tmp_path / "web.log", **env)
    workers: list[Supervised] = []
    agents = Agents("", tmp_path)
    try:
        web.start()
        agents.url = web.url
        for args in (
            ["worker", "-Q", "scheduler,default", "--pool", "threads", "-c", "2"],
            ["beat", "--schedule", str(tmp_path / "beat-schedule")],
        ):
            workers.append(
                Supervised(
                    [sys.executable, "-m", "celery", "-A", "config", *args],
                    web.env,
                    tmp_path / f"{args[0]}.log",
                )
            )
        agents.start("h1", fleet["tokens"]["h1"], "2xH100-80GB-SXM")
        wait_for_registration(["h1"])
        api = APIClient()
        api.credentials(
            HTTP_AUTHORIZATION=f"Bearer {token_create(user=team['member'], name='r').secret}"
        )
        ids = [
            api.post(
                f"{web.url}/api/v1/jobs",
                {
                    "project": "alpha",
                    "name": f"r{i}",
                    "command": "sleep 4",
                    "gpu_model": "H100-80GB-SXM",
                    "gpus": 2,
                },
                format="json",
            ).json()["id"]
            for i in range(3)
        ]
        # One runs (h1 has 2 GPUs), two wait in the queue.
        wait_for(
            lambda: Job.objects.filter(pk__in=ids, state=JobState.RUNNING).count() == 1, timeout=30
        )

        redis.stop()
        time.sleep(2)
        redis.start()  # empty: broker messages, locks and the live cache are gone

        wait_for(
            lambda: Job.objects.filter(pk__in=ids, state=JobState.SUCCEEDED).count() == 3,
            timeout=90,
        )
        assert all(j.attempt == 1 for j in Job.objects.filter(pk__in=ids))  # each ran once
        assert_invariants()
    finally:
        agents.stop_all()
        for supervised in workers:
            supervised.stop()
        web.stop()
        redis.stop()
