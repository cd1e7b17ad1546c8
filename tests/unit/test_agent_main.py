"""The whole agent in-process against a fake portal that implements the agent API contract."""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from agent.config import Config
from agent.gpus import TELEMETRY_KEYS
from agent.main import Agent
from tests.polling import wait_for

TOKEN = "node-token-for-tests-0123456789"
API = "/api/agent/v1"


class FakePortal:
    """A threaded loopback server speaking the agent API; tests script its state."""

    def __init__(self, *, sync: bool = True) -> None:
        self.sync = sync  # False: a portal from before /sync (it answers 404)
        self.version = 1  # of the assignments and fence, bumped by `set`
        self.lock = threading.Lock()
        self.calls: list[tuple[str, str, Any]] = []  # (method, path, body), in arrival order
        self.assignments: list[dict[str, Any]] = []
        self.fenced = False
        self.deleted_volumes: list[int] = []  # told in each heartbeat answer
        self.unfence_when_idle = False
        self.down = False  # answer 503 to everything, like a restarting portal
        self.stale: set[tuple[int, int]] = set()  # (job, attempt) answered with 409
        self.raw_paths: set[str] = set()  # paths the agent really requested
        # Cleared: syncs and assignment reads are held unanswered (a portal slow to answer
        # them) until it is set again; `stalled` counts those held, with their client ports.
        self.syncs_open = threading.Event()
        self.syncs_open.set()
        self.stalled: list[int] = []
        self.beat_ports: list[int] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                port = self.client_address[1]
                if self.path.endswith(("/sync", "/assignments")) and not outer.syncs_open.is_set():
                    with outer.lock:
                        outer.stalled.append(port)
                    outer.syncs_open.wait(30)
                if self.path.endswith("/heartbeat"):
                    with outer.lock:
                        outer.beat_ports.append(port)
                status, answer = outer.answer(self.command, self.path, body, self.headers)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = _handle

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    def answer(self, method: str, path: str, body: Any, headers: Any) -> tuple[int, Any]:
        with self.lock:
            if self.down:
                return 503, {"detail": "restarting"}
            if headers.get("Authorization") != f"Bearer {TOKEN}":
                return 401, {"detail": "bad token"}
            assert path.startswith(API), path
            path = path[len(API) :]
            self.raw_paths.add(path)
            self.calls.append((method, path, body))
            if path == "/register":
                return 200, {"node": "node-1", "heartbeat_interval_s": 0.1, "poll_interval_s": 0.05}
            if path == "/heartbeat":
                if self.fenced and self.unfence_when_idle and not body["running"]:
                    self.fenced = False
                    self.version += 1
                answer = {"ok": True, "fenced": self.fenced}
                return 200, {**answer, "deleted_volumes": list(self.deleted_volumes)}
            if path == "/sync" and self.sync:
                return 200, self._sync(body)
            if path == "/assignments":
                return 200, {"fenced": self.fenced, "assignments": list(self.assignments)}
            match = re.fullmatch(r"/jobs/(\d+)/(started|exited|logs)", path)
            if match:
                if (int(match.group(1)), body["attempt"]) in self.stale:
                    return 409, {"detail": "stale attempt"}
                return 200, {"ok": True}
            return 404, {"detail": "no such endpoint"}

    def _sync(self, body: dict[str, Any]) -> dict[str, Any]:
        """/sync as the portal answers it; each report is also recorded under its old path."""
        results = []
        for report in body["reports"]:
            key = (report["job_id"], report["attempt"])
            rest = {k: v for k, v in report.items() if k not in ("kind", "job_id")}
            self.calls.append(("POST", f"/jobs/{report['job_id']}/{report['kind']}", rest))
            result = {"kind": report["kind"], "job_id": key[0], "attempt": key[1]}
            result.update({"conflict": "stale attempt"} if key in self.stale else {"state": "ok"})
            results.append(result)
        if not body["assignments"]:
            return {"results": results}
        version = str(self.version)
        if body["version"] == version:
            return {"unchanged": True, "version": version, "results": results}
        return {
            "unchanged": False,
            "version": version,
            "fenced": self.fenced,
            "assignments": list(self.assignments),
            "results": results,
        }

    def polls(self, calls: list[tuple[str, str, Any]] | None = None) -> list[int]:
        """Indexes of the calls that read the assignments."""
        with self.lock:
            calls = self.calls if calls is None else calls
            return [
                i
                for i, (_, p, b) in enumerate(calls)
                if p == "/assignments" or (p == "/sync" and b["assignments"])
            ]

    def wait_for_polls(self, n: int = 3, timeout: float = 5.0) -> None:
        """Until the agent has read its assignments `n` more times: whatever it would do on a
        poll (start, stop, report) has had its chance, without guessing how long that takes."""
        before = len(self.polls())
        wait_for(lambda: len(self.polls()) >= before + n, timeout)

    # -- what the agent told us ------------------------------------------------------------------

    def bodies(self, path: str) -> list[Any]:
        with self.lock:
            return [b for _, p, b in self.calls if p == path]

    def job_reports(self, job_id: int, kind: str) -> list[dict[str, Any]]:
        return self.bodies(f"/jobs/{job_id}/{kind}")

    def log_text(self, job_id: int, stream: str = "stdout", attempt: int | None = None) -> str:
        chunks = [
            b
            for b in self.job_reports(job_id, "logs")
            if b["stream"] == stream and (attempt is None or b["attempt"] == attempt)
        ]
        return "".join(c["text"] for c in sorted(chunks, key=lambda c: c["seq"]))

    def index_of(self, path: str, pred: Callable[[Any], bool] = lambda b: True) -> int:
        with self.lock:
            for i, (_, p, b) in enumerate(self.calls):
                if p == path and pred(b):
                    return i
        raise AssertionError(f"no {path} call")

    def set(self, **state: Any) -> None:
        with self.lock:
            for k, v in state.items():
                setattr(self, k, v)
            self.version += 1

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def job(job_id: int, command: str, attempt: int = 1, **kw: Any) -> dict[str, Any]:
    return {
        "job_id": job_id,
        "attempt": attempt,
        "action": "run",
        "stop_reason": None,
        "command": command,
        "env": {"JOB_ID": str(job_id)},
        "gpu_uuids": [],
        "share_milli": 1000,
        "gpu_memory_limit_mib": None,
        "working_dir": None,
        "checkpoint_dir": None,
        "grace_seconds": 5,
        **kw,
    }


class Running:
    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.stop = threading.Event()
        self.thread = threading.Thread(target=agent.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def shut_down(self, timeout: float = 15.0) -> None:
        self.stop.set()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the agent did not stop"


@pytest.fixture(params=[True, False], ids=["sync", "before-sync"])
def portal(request: pytest.FixtureRequest) -> Iterator[FakePortal]:
    p = FakePortal(sync=request.param)
    yield p
    p.close()


@pytest.fixture
def start_agent(tmp_path: Path, portal: FakePortal) -> Iterator[Callable[..., Running]]:
    running: list[Running] = []

    def start(token: str = TOKEN, **config: Any) -> Running:
        cfg = Config(
            portal_url=portal.url,
            token=token,
            workdir=tmp_path / "work",
            simulate=True,
            sim_gpus="2xH100-80GB-SXM",
            sim_seed=1,
            hostname="test-host",
            tick_s=0.02,
            log_flush_s=0.1,
            backoff_initial_s=0.05,
            backoff_max_s=0.2,
            **{"runtime": "process", "job_uid_base": 0, **config},
        )
        r = Running(Agent(cfg))
        running.append(r)
        return r

    yield start
    for r in running:
        r.shut_down()


def test_registers_heartbeats_runs_a_job_and_reports_it(
    portal: FakePortal, start_agent: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    agent = start_agent()
    (reg,) = wait_for(lambda: portal.bodies("/register"))
    assert reg["hostname"] == "test-host" and reg["simulated"] is True
    assert reg["cpu_milli"] >= 1000 and reg["memory_mib"] > 0
    assert reg["driver_version"] and reg["cuda_version"]
    assert [g["name"] for g in reg["gpus"]] == ["H100-80GB-SXM"] * 2
    assert set(reg["gpus"][0]) == {"index", "uuid", "name", "memory_mib", "mig_mode"}
    # the process runtime runs gang members anywhere
    assert reg["gang_members"] is True and "gang_members_reason" not in reg
    gpu0, gpu1 = (g["uuid"] for g in reg["gpus"])

    # The portal's intervals are used: several heartbeats within half a second.
    wait_for(lambda: len(portal.bodies("/heartbeat")) >= 3, 2.0)
    beat = portal.bodies("/heartbeat")[0]
    assert beat["running"] == []
    assert [t["uuid"] for t in beat["telemetry"]] == [gpu0, gpu1]
    # exactly the contract's keys, plus how long before the heartbeat each sample was taken
    assert set(beat["telemetry"][0]) == {*TELEMETRY_KEYS, "age_s"}
    assert all(0 <= t["age_s"] < 2 for t in beat["telemetry"])

    portal.set(
        assignments=[
            job(1, "echo hello from job 1; echo warning >&2; sleep 0.4; exit 7", gpu_uuids=[gpu0])
        ]
    )
    (exited,) = wait_for(lambda: portal.job_reports(1, "exited"))
    assert exited == {
        "attempt": 1,
        "exit_code": 7,
        "signal": None,
        "reason": "exited",
        "message": "exit code 7",
    }
    (started,) = portal.job_reports(1, "started")
    assert started["attempt"] == 1 and started["pid"] > 0
    assert portal.log_text(1) == "hello from job 1\n"
    assert portal.log_text(1, "stderr") == "warning\n"
    # Order: started, then every log chunk, then exited.
    first_log = portal.index_of("/jobs/1/logs")
    assert portal.index_of("/jobs/1/started") < first_log < portal.index_of("/jobs/1/exited")

    # While it ran, the heartbeat said so, and its GPU was the busy one.
    while_running = [
        b for b in portal.bodies("/heartbeat") if b["running"] and b["running"][0]["job_id"] == 1
    ]
    assert while_running and while_running[0]["running"] == [
        {"job_id": 1, "attempt": 1, "pid": started["pid"]}
    ]
    telemetry = {t["uuid"]: t for t in while_running[-1]["telemetry"]}
    assert telemetry[gpu0]["utilization"] >= 70 and telemetry[gpu1]["utilization"] <= 3

    # The finished attempt is still in the assignment list for a while: it is not rerun.
    portal.wait_for_polls()
    assert len(portal.job_reports(1, "started")) == 1
    agent.shut_down()
    assert TOKEN not in caplog.text


def test_sync_carries_the_reports_and_idle_polls_send_the_version(
    portal: FakePortal, start_agent: Callable[..., Running]
) -> None:
    if not portal.sync:
        pytest.skip("the /sync protocol only")
    portal.set(assignments=[job(12, "sleep 300"), job(13, "sleep 300")])
    start_agent()
    wait_for(lambda: portal.job_reports(12, "started") and portal.job_reports(13, "started"))
    portal.wait_for_polls()  # a few idle polls
    with portal.lock:
        paths = [p for _, p, _ in portal.calls]
        syncs = [b for _, p, b in portal.calls if p == "/sync"]
    assert "/assignments" not in paths  # one round trip does it all
    assert not any(re.fullmatch(r"/jobs/\d+/started", p) for p in paths if p in portal.raw_paths)
    started = [r for b in syncs for r in b["reports"] if r["kind"] == "started"]
    assert sorted(r["job_id"] for r in started) == [12, 13]
    assert syncs[-1]["version"] == str(portal.version)  # idle: "what I have is this version"

    # A new version brings the new assignments: 13 is no longer assigned.
    portal.set(assignments=[job(12, "sleep 300")])
    (exited,) = wait_for(lambda: portal.job_reports(13, "exited"), 5.0)
    assert "no longer assigned" in exited["message"]


def test_a_conflict_in_a_sync_answer_forgets_that_attempt_only(
    portal: FakePortal, start_agent: Callable[..., Running]
) -> None:
    if not portal.sync:
        pytest.skip("the /sync protocol only")
    portal.set(stale={(14, 1)}, assignments=[job(14, "sleep 300"), job(15, "sleep 300")])
    start_agent()
    wait_for(lambda: portal.job_reports(14, "started") and portal.job_reports(15, "started"))
    # 14 was stopped and forgotten; 15 runs on
    wait_for(lambda: [r["job_id"] for r in portal.bodies("/heartbeat")[-1]["running"]] == [15])
    portal.wait_for_polls()
    assert portal.job_reports(14, "exited") == []


def test_stops_a_job_that_disappears_from_the_assignments(
    portal: FakePortal, start_agent: Callable[..., Running]
) -> None:
    portal.set(assignments=[job(2, "sleep 300"), job(3, "sleep 300")])
    start_agent()
    wait_for(lambda: portal.job_reports(2, "started") and portal.job_reports(3, "started"))
    pid = portal.job_reports(2, "started")[0]["pid"]
    assert alive(pid)

    portal.set(assignments=[job(3, "sleep 300")])
    (exited,) = wait_for(lambda: portal.job_reports(2, "exited"), 5.0)
    assert exited["reason"] == "killed" and exited["signal"] == 15
    assert "no longer assigned" in exited["message"]
    assert not alive(pid)
    wait_for(lambda: [r["job_id"] for r in portal.bodies("/heartbeat")[-1]["running"]] == [3], 2.0)
    assert portal.job_reports(3, "exited") == []


def test_preempt_checkpoints_and_the_next_attempt_resumes(
    portal: FakePortal, start_agent: Callable[..., Running], tmp_path: Path
) -> None:
    # the checkpoint in a node-local volume (v7), which the agent places under its workdir
    ckpt = tmp_path / "work" / "volumes" / "v7" / "runs" / "4"
    workload = f"{sys.executable} -m agent.workload --seconds 60 --step-seconds 0.05 --checkpoint-every 0.2"
    env = {"JOB_ID": "4", "RESUME": "0"}
    storage = {
        "project_id": 2,
        "volumes": [{"id": 7, "name": "ckpt", "kind": "node_local", "mount_path": "/ckpt"}],
        "checkpoint": {"volume": "ckpt", "path": "runs/4"},
    }
    portal.set(assignments=[job(4, workload, env=env, **storage)])
    start_agent()
    wait_for(lambda: "step 5/" in portal.log_text(4))

    portal.set(
        assignments=[job(4, workload, env=env, action="stop", stop_reason="preempt", **storage)]
    )
    (exited,) = wait_for(lambda: portal.job_reports(4, "exited"), 5.0)
    assert exited["reason"] == "preempted"
    # The shell (dash does not exec a lone command) dies of the SIGTERM at once; the workload in
    # the same group got it too, and the agent waited for it to save and exit (143).
    assert exited["exit_code"] == 143 or exited["signal"] == 15
    assert "ended after SIGTERM" in exited["message"]
    saved = json.loads((ckpt / "checkpoint.json").read_text())
    assert saved["step"] >= 5
    assert "SIGTERM: checkpoint saved" in portal.log_text(4)

    resume_env = {**env, "RESUME": "1"}
    portal.set(assignments=[job(4, workload, attempt=2, env=resume_env, **storage)])
    wait_for(lambda: "resumed from checkpoint" in portal.log_text(4, attempt=2))
    assert f"resumed from checkpoint at step {saved['step']}" in portal.log_text(4, attempt=2)
    seqs = [b["seq"] for b in portal.job_reports(4, "logs") if b["attempt"] == 2]
    assert min(seqs) == 0  # seq numbers restart per attempt

    # The job goes away and the portal deletes the volume: its files go too, and the
    # stopped job's workspace once the job is no longer assigned here.
    portal.set(assignments=[], deleted_volumes=[7])
    wait_for(lambda: portal.job_reports(4, "exited")[1:], 5.0)
    wait_for(lambda: not (tmp_path / "work" / "volumes" / "v7").exists(), 5.0)
    wait_for(lambda: not (tmp_path / "work" / "jobs" / "4").exists(), 5.0)


def test_an_assignment_for_gpus_this_node_lacks_is_refused(
    portal: FakePortal, start_agent: Callable[..., Running]
) -> None:
    portal.set(assignments=[job(10, "echo should not run", gpu_uuids=["GPU-not-here"])])
    start_agent()
    (exited,) = wait_for(lambda: portal.job_reports(10, "exited"))
    assert exited["reason"] == "failed_to_start" and "GPU-not-here" in exited["message"]
    portal.wait_for_polls()
    assert portal.job_reports(10, "started") == [] and portal.log_text(10) == ""
    assert len(portal.job_reports(10, "exited")) == 1  # refused once, not on every poll


def test_a_malformed_entry_does_not_stop_the_attempt_it_names(
    portal: FakePortal, start_agent: Callable[..., Running]
) -> None:
    portal.set(assignments=[job(11, "sleep 300")])
    start_agent()
    wait_for(lambda: portal.job_reports(11, "started"))
    portal.set(assignments=[job(11, "sleep 300", env=["not", "an", "object"])])
    portal.wait_for_polls()
    assert portal.job_reports(11, "exited") == []
    assert [r["job_id"] for r in portal.bodies("/heartbeat")[-1]["running"]] == [11]


def test_obeys_fenced_stops_everything_and_starts_nothing_until_unfenced(
    portal: FakePortal, start_agent: Callable[..., Running]
) -> None:
    portal.set(assignments=[job(5, "sleep 300")])
    start_agent()
    wait_for(lambda: portal.job_reports(5, "started"))
    pid = portal.job_reports(5, "started")[0]["pid"]

    # The portal fences the node and wants a different job; the node must drain first.
    portal.set(fenced=True, assignments=[job(6, "echo six")])
    (exited,) = wait_for(lambda: portal.job_reports(5, "exited"), 5.0)
    assert exited["reason"] == "killed" and "fenced" in exited["message"]
    assert not alive(pid)
    portal.wait_for_polls()
    assert portal.job_reports(6, "started") == []  # nothing new while fenced
    assert portal.bodies("/heartbeat")[-1]["running"] == []

    portal.set(unfence_when_idle=True)
    wait_for(lambda: portal.job_reports(6, "exited"), 5.0)
    assert portal.index_of("/jobs/5/exited") < portal.index_of("/jobs/6/started")


def test_a_409_makes_the_agent_stop_and_forget_the_attempt(
    portal: FakePortal, start_agent: Callable[..., Running]
) -> None:
    portal.set(assignments=[job(7, "echo tick; sleep 300")])
    start_agent()
    wait_for(lambda: portal.job_reports(7, "started"))
    pid = portal.job_reports(7, "started")[0]["pid"]
    portal.set(stale={(7, 1)})  # the log chunk now answers 409
    wait_for(lambda: not alive(pid), 5.0)
    # the heartbeats (their own thread) stop listing it once the main loop has reaped it
    wait_for(lambda: portal.bodies("/heartbeat")[-1]["running"] == [], 5.0)
    assert portal.job_reports(7, "exited") == []  # a forgotten attempt is not reported


def test_rides_out_a_portal_outage_and_reconciles(
    portal: FakePortal, start_agent: Callable[..., Running]
) -> None:
    portal.set(assignments=[job(8, "sleep 0.2; echo finished during the outage")])
    start_agent()
    (started,) = wait_for(lambda: portal.job_reports(8, "started"))
    portal.set(down=True)
    wait_for(lambda: not alive(started["pid"]), 5.0)  # the job ends while the portal is away
    calls_before = len(portal.calls)
    portal.set(down=False)

    (exited,) = wait_for(lambda: portal.job_reports(8, "exited"), 5.0)
    assert exited["exit_code"] == 0
    assert portal.log_text(8) == "finished during the outage\n"
    assert len(portal.job_reports(8, "started")) == 1  # not restarted on reconnect

    # After reconnecting it first reports what it runs, then reads its assignments.
    def after() -> list[tuple[str, str, Any]]:
        with portal.lock:
            return portal.calls[calls_before:]

    wait_for(lambda: portal.polls(after()), 3.0)
    heartbeats = [i for i, (_, p, _) in enumerate(after()) if p == "/heartbeat"]
    assert heartbeats and heartbeats[0] < portal.polls(after())[0]


def test_heartbeats_go_out_while_a_sync_is_held_unanswered(
    portal: FakePortal, start_agent: Callable[..., Running]
) -> None:
    """A sync the portal is slow to answer (or one the agent is retrying) does not hold the
    heartbeats back: they keep coming at their interval, on a connection of their own."""
    agent = start_agent(request_timeout_s=30.0)
    wait_for(lambda: portal.polls() and portal.bodies("/heartbeat"), 3.0)
    portal.syncs_open.clear()
    try:
        wait_for(lambda: portal.stalled, 3.0)  # a sync is in flight, unanswered
        with portal.lock:
            beats_before = len(portal.beat_ports)
        # the portal's interval is 0.1 s: several heartbeats while the sync waits
        wait_for(lambda: len(portal.beat_ports) >= beats_before + 3, 3.0)
        with portal.lock:
            held, beat_ports = list(portal.stalled), portal.beat_ports[beats_before:]
        assert len(held) == 1  # the main loop is still waiting on that one sync
        assert held[0] not in beat_ports  # the heartbeats did not queue on its connection
    finally:
        portal.syncs_open.set()
    # The sync answered, the loop goes on; shutting down stops the heartbeat thread too.
    polls = len(portal.polls())
    wait_for(lambda: len(portal.polls()) > polls, 3.0)
    agent.shut_down()
    assert agent.agent.stop_beats()  # the heartbeat thread has ended (it answers without waiting)


def test_shutdown_stops_all_work_and_reports_it(
    portal: FakePortal, start_agent: Callable[..., Running], tmp_path: Path
) -> None:
    pidfile = tmp_path / "child.pid"
    portal.set(assignments=[job(9, f"sleep 300 & echo $! > {pidfile}; wait", grace_seconds=10)])
    agent = start_agent()
    wait_for(lambda: portal.job_reports(9, "started") and pidfile.exists() and pidfile.read_text())
    pid = portal.job_reports(9, "started")[0]["pid"]
    child = int(pidfile.read_text())

    agent.shut_down()
    assert not alive(pid) and not alive(child)
    (exited,) = portal.job_reports(9, "exited")
    assert exited["reason"] == "killed" and "shutting down" in exited["message"]
    assert portal.bodies("/heartbeat")[-1]["running"] == []


def test_a_rejected_token_is_logged_clearly_and_never_printed(
    portal: FakePortal, start_agent: Callable[..., Running], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    bad = "wrong-token-abcdefghijklmnop"
    agent = start_agent(token=bad, unauthorized_backoff_s=3600.0)
    wait_for(lambda: "rejected this node's token" in caplog.text, 3.0)
    assert portal.calls == []  # nothing authenticated got through
    agent.shut_down()  # it was waiting out an hour's backoff; it stops (within shut_down's join)
    assert bad not in caplog.text and TOKEN not in caplog.text


def test_config_from_env_and_flags(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    token_file.chmod(0o600)
    env = {
        "PORTAL_URL": "https://portal.example",
        "NODE_TOKEN": "from-env",
        "AGENT_SIMULATE": "yes",
        "AGENT_SIM_GPUS": "2xL4,2xT4",
        "AGENT_WORKDIR": str(tmp_path / "w"),
        "AGENT_HEARTBEAT_INTERVAL": "7.5",
    }
    cfg = Config.from_args(["--poll-interval", "1.5", "--token-file", str(token_file)], env)
    assert cfg.portal_url == "https://portal.example"
    assert cfg.token == TOKEN  # the file wins over the environment
    assert cfg.simulate is True and cfg.sim_gpus == "2xL4,2xT4"
    assert cfg.workdir == tmp_path / "w"
    assert (cfg.heartbeat_interval_s, cfg.poll_interval_s) == (7.5, 1.5)
    assert TOKEN not in repr(cfg)
    assert (cfg.watch, cfg.events_url, cfg.watch_poll_interval_s) == (True, "", 30.0)
    watch = Config.from_args(
        ["--events-url", "https://events.example", "--watch-poll-interval", "45"], env
    )
    assert (watch.events_url, watch.watch_poll_interval_s) == ("https://events.example", 45.0)
    assert Config.from_args(["--no-watch"], env).watch is False
    assert Config.from_args([], {**env, "AGENT_WATCH": "0"}).watch is False
    relative = Config.from_args(["--workdir", "var/agents/n1"], {**env, "AGENT_WORKDIR": ""})
    assert relative.workdir.is_absolute() and relative.workdir.parts[-3:] == ("var", "agents", "n1")
    with pytest.raises(SystemExit):
        Config.from_args([], {"PORTAL_URL": "http://x"})  # no token
    with pytest.raises(SystemExit):
        Config.from_args([], {**env, "AGENT_SIM_GPUS": "3xB300"})


def test_main_runs_until_sigterm(portal: FakePortal, tmp_path: Path) -> None:
    """`python -m agent` as a real process: registers, then exits cleanly on SIGTERM."""
    import signal
    import subprocess

    env = {
        **os.environ,
        "PORTAL_URL": portal.url,
        "NODE_TOKEN": TOKEN,
        "AGENT_WORKDIR": str(tmp_path / "w"),
        "AGENT_SIMULATE": "1",
        "AGENT_RUNTIME": "process",
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
    }
    proc = subprocess.Popen([sys.executable, "-m", "agent"], env=env, stderr=subprocess.PIPE)
    try:
        wait_for(lambda: portal.bodies("/heartbeat"), 8.0)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.stderr is not None
    err = proc.stderr.read().decode()
    assert "registered as node node-1" in err and "SIGTERM received" in err
    assert TOKEN not in err


def test_the_pause_between_rounds_keeps_the_poll_interval(tmp_path: Path) -> None:
    """Ticks do not round the poll interval up: the pause ends when the next poll is due."""
    agent = Agent(
        Config(
            portal_url="http://127.0.0.1:9",
            token=TOKEN,
            workdir=tmp_path,
            simulate=True,
            sim_gpus="1xH100-80GB-SXM",
            poll_interval_s=0.5,
            heartbeat_interval_s=5,
            tick_s=0.2,
            runtime="process",
        )
    )
    now = time.monotonic()
    agent._next_contact = 0.0
    agent._next_poll = now + 0.1
    assert 0.05 < agent.pause() <= 0.1  # the poll falls due within the tick
    agent._next_poll = now + 3
    assert agent.pause() == pytest.approx(0.2)  # nothing due: a whole tick
    agent._next_poll = now - 1
    assert 0 < agent.pause() <= 0.005  # overdue: go round at once
    agent._next_contact = now + 0.15  # backing off: not before the next contact
    assert 0.1 < agent.pause() <= 0.15


def test_a_heartbeat_carries_only_the_newest_instants_the_protocol_allows(tmp_path: Path) -> None:
    """After an outage the buffer holds more than one heartbeat may carry: the newest instants
    that fit are sent, the older ones dropped, and no sample lists more processes than allowed."""
    from agent.protocol import MAX_HEARTBEAT_SAMPLES, MAX_SAMPLE_PROCESSES

    agent = Agent(
        Config(
            portal_url="http://127.0.0.1:9",
            token=TOKEN,
            workdir=tmp_path,
            simulate=True,
            sim_gpus="1xH100-80GB-SXM",
            runtime="process",
        )
    )
    gpus = 64
    processes = [{"pid": p, "used_memory_mib": 1} for p in range(MAX_SAMPLE_PROCESSES + 5)]
    agent._buffer = [
        (float(t), [{"uuid": f"GPU-{g}", "processes": processes} for g in range(gpus)])
        for t in range(30)
    ]
    sent = agent._instants_that_fit()
    assert sum(len(samples) for _, samples in sent) <= MAX_HEARTBEAT_SAMPLES
    assert len(sent) == MAX_HEARTBEAT_SAMPLES // gpus
    assert [taken for taken, _ in sent] == [float(t) for t in range(30 - len(sent), 30)]
    assert all(len(s["processes"]) == MAX_SAMPLE_PROCESSES for _, ss in sent for s in ss)
    assert len(agent._buffer) == len(sent)  # the older instants will never be sent


def test_registration_says_when_gang_members_cannot_run_here(tmp_path: Path) -> None:
    """A container runtime whose job network fence cannot be put in place registers as a node
    that cannot run gang members, saying why; once it is in place, as one that can."""
    from agent.runner import Runner
    from agent.runtime import ContainerRuntime, jobnet

    runtime = ContainerRuntime(default_image="none", node_label="unit-test")
    config = Config(
        portal_url="http://127.0.0.1:9",
        token=TOKEN,
        workdir=tmp_path,
        simulate=True,
        sim_gpus="1xH100-80GB-SXM",
    )
    agent = Agent(config, runner=Runner(tmp_path, runtime=runtime))
    reg = agent.registration()
    assert reg["gang_members"] is False
    assert reg["gang_members_reason"] == "the agent runs without a job network fence"
    runtime.network = jobnet.JobNetwork(uid_base=300_000, nft="false")
    reg = agent.registration()
    assert reg["gang_members"] is False
    assert reg["gang_members_reason"].startswith(
        "its job network fence is not in place: nft refused the fence"
    )
    # the fence in place (an nft that lists the table with its digest)
    listing = tmp_path / "nft"
    listing.write_text(f"#!/bin/sh\necho 'comment \"{jobnet.MARK} {runtime.network.digest}\"'\n")
    listing.chmod(0o755)
    runtime.network.nft = [str(listing)]
    assert agent.registration()["gang_members"] is True
    assert "gang_members_reason" not in agent.registration()


def test_a_starting_agent_sweeps_what_a_crashed_one_left_on_disk(
    portal: FakePortal, start_agent: Callable[..., Running], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    for path in ("jobs/99/model.pt", "scratch/99/tmp/blob"):
        (work / path).parent.mkdir(parents=True)
        (work / path).write_text("left behind")
    (work / "volumes" / "v3").mkdir(parents=True)  # a node-local volume: kept
    start_agent()
    wait_for(lambda: portal.bodies("/heartbeat"))
    assert not (work / "jobs" / "99").exists() and not (work / "scratch" / "99").exists()
    assert (work / "volumes" / "v3").is_dir()
