"""Running assigned work as process groups: start, stream logs, stop with grace, report exits.

Each attempt runs in a new session (its own process group), as `/bin/sh -c <command>`, or, for a
plain simple command the shell would only fork and wait for (`sleep 3600`), as the program itself
(the process runtime's `direct_argv`). Either way a stop reaches every process the job started:
SIGTERM to the group, `grace_seconds`, then SIGKILL. What the agent must tell the portal
(started, log chunks, exited) is queued in `Runner.outbox`, in order; the main loop sends it.
The runner is driven by one thread (`poll()`); only the pipe readers run on their own threads.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Mapping, Set
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import protocol
from agent.runtime import Launch, LaunchError, ProcessRuntime, Runtime
from agent.storage import DEFAULT_PROJECT_GID_BASE, Mount, Plan, Storage, StorageError

log = logging.getLogger(__name__)

# What a stop is reported as, by the portal's stop_reason.
EXIT_REASON_BY_STOP_REASON: dict[str | None, str] = {
    "preempt": "preempted",
    "resize": "preempted",
    "cancel": "cancelled",
    None: "killed",
}

# A job's environment is an allow-list: these basics, what the job asked for and what the
# platform sets (agent.protocol.PLATFORM_ENV). Nothing else of the agent's environment (its
# token, the portal's secrets a launcher may have left in it) reaches a job.
JOB_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BASE_ENV_KEYS = ("LANG", "LC_ALL", "TZ")
# Never set from anywhere but the agent itself, whatever the job asks for.
PRIVATE_ENV = frozenset({"NODE_TOKEN", "NODE_TOKEN_FILE", "PORTAL_URL"})
# Per-client MPS limits are set per job, never inherited from the agent.
PER_JOB_CUDA_ENV = frozenset(
    {
        "CUDA_VISIBLE_DEVICES",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    }
)

DEFAULT_GRACE_S = 30.0
LEFTOVER_GRACE_S = 5.0  # background processes still alive after the job's main process ended
READER_DRAIN_S = 5.0  # how long to wait for the pipes to close after the group is gone
STATE_FILE_NAME = "agent-state.json"


class AssignmentError(ValueError):
    """An assignment from the portal that does not have the contract's shape."""


@dataclass(frozen=True)
class Assignment:
    """One entry of `GET /assignments`."""

    job_id: int
    attempt: int
    action: str  # "run" | "stop"
    command: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    gpu_uuids: tuple[str, ...] = ()
    share_milli: int = 1000
    gpu_memory_limit_mib: int | None = None
    working_dir: str | None = None  # in the container (None: /workspace)
    grace_seconds: float = DEFAULT_GRACE_S
    stop_reason: str | None = None
    image: str = ""
    time_limit_s: int | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    shm_mib: int = 0
    # Storage, as sent: checked when the attempt starts (agent.storage.Storage.plan), so a bad
    # one is a failed start the portal hears of, not an assignment ignored.
    project_id: int = 0
    volumes: tuple[Any, ...] = ()
    checkpoint: Any = None

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)

    @classmethod
    def from_dict(
        cls, data: Mapping[str, Any], *, default_grace_s: float = DEFAULT_GRACE_S
    ) -> Assignment:
        try:
            job_id = int(data["job_id"])
            attempt = int(data["attempt"])
            action = str(data.get("action") or "run")
            if action not in ("run", "stop"):
                raise AssignmentError(f"unknown action {action!r}")
            env = data.get("env") or {}
            if not isinstance(env, Mapping):
                raise AssignmentError("env is not an object")
            limit = data.get("gpu_memory_limit_mib")
            grace = data.get("grace_seconds")
            share = data.get("share_milli")
            time_limit = data.get("time_limit_s")
            return cls(
                job_id=job_id,
                attempt=attempt,
                action=action,
                command=str(data.get("command") or ""),
                env={str(k): str(v) for k, v in env.items()},
                gpu_uuids=tuple(str(u) for u in data.get("gpu_uuids") or ()),
                share_milli=int(share) if share is not None else 1000,
                gpu_memory_limit_mib=int(limit) if limit is not None else None,
                working_dir=data.get("working_dir") or None,
                grace_seconds=float(grace) if grace is not None else default_grace_s,
                stop_reason=data.get("stop_reason"),
                image=str(data.get("image") or ""),
                time_limit_s=int(time_limit) if time_limit else None,
                cpu_milli=int(data.get("cpu_milli") or 0),
                memory_mib=int(data.get("memory_mib") or 0),
                shm_mib=int(data.get("shm_mib") or 0),
                project_id=int(data.get("project_id") or 0),
                volumes=tuple(data.get("volumes") or ()),
                checkpoint=data.get("checkpoint") or None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AssignmentError(f"malformed assignment {data!r}: {exc}") from exc


@dataclass
class Message:
    """Something to tell the portal about one job attempt: started, logs or exited."""

    job_id: int
    attempt: int
    kind: str
    body: dict[str, Any]

    @property
    def key(self) -> tuple[int, int]:
        return (self.job_id, self.attempt)

    @property
    def path(self) -> str:
        return f"/jobs/{self.job_id}/{self.kind}"


# ---------------------------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------------------------


def _proc_stat(pid: int) -> tuple[str, int, int, int] | None:
    """(state, process group, session, start time in ticks) from /proc, or None."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[-1].split()
    try:
        return fields[0], int(fields[2]), int(fields[3]), int(fields[19])
    except (IndexError, ValueError):
        return None


def process_start_ticks(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return stat[3] if stat else None


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    proc = Path("/proc")
    if not proc.is_dir():  # not Linux: ask the kernel whether anything is left
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    members = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _proc_stat(int(entry.name))
        if stat is not None and stat[1] == pgid and stat[0] not in ("Z", "X"):
            members.append(int(entry.name))
    return members


# setpriv (util-linux) switches the uid after exec, so the agent can start the job with
# vfork: Python's own user=/group= switch needs a full fork() of the agent, whose cost grows
# with its memory and threads (about 11 ms of the agent's CPU per start at 50 nodes' worth of
# agents in one process, against 0.2 ms; bench.submit_throughput).
SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")


def _switch_user(launch: Launch) -> tuple[list[str], dict[str, Any]]:
    """The argv and Popen arguments that start `launch` as its own uid and gid, with only the
    supplementary groups it names (its project's, for the volumes) and umask 077, or 007 with
    a project group so the project's other jobs can write what it writes in a shared volume
    (the argv unchanged when no switch is asked for)."""
    if launch.user is None:
        return launch.argv, {}
    group = launch.user if launch.group is None else launch.group
    umask = 0o007 if launch.groups else 0o077
    if SETPRIV:
        groups = ",".join(str(g) for g in launch.groups)
        return [
            SETPRIV,
            f"--reuid={launch.user}",
            f"--regid={group}",
            f"--groups={groups}" if groups else "--clear-groups",
            "--",
            *launch.argv,
        ], {"umask": umask}
    return launch.argv, {
        "user": launch.user,
        "group": group,
        "extra_groups": list(launch.groups),
        "umask": umask,
    }


def signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a whole process group; False when nothing is left in it."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    except PermissionError:
        log.warning("no permission to signal process group %d", pgid)
        return False
    return True


def _describe_status(returncode: int) -> str:
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = "?"
    return f"killed by signal {-returncode} ({name})"


def agent_source_root() -> str | None:
    """The directory holding the `agent` package when it runs from a source checkout.

    Jobs get it appended to PYTHONPATH so that `python3 -m agent.workload` works from their own
    working directory; an installed agent (site-packages) adds nothing to a job's path.
    """
    root = Path(__file__).resolve().parent.parent
    return None if root.name in ("site-packages", "dist-packages") else str(root)


def free_port() -> int:
    """A TCP port nothing listens on now (the kernel's choice, as torchrun's standalone mode)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


@functools.cache
def _boot_id() -> str:
    """This boot of the host (it cannot change while the agent runs: read once)."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------
# log streams
# ---------------------------------------------------------------------------------------------


class _Stream:
    """Reads one pipe on a thread into a bounded buffer; the runner takes chunks from it."""

    def __init__(self, name: str, fd: int, *, max_buffer: int, thread_name: str) -> None:
        self.name = name
        self._fd = fd
        self._max_buffer = max_buffer
        self._lock = threading.Lock()
        self._buffer = bytearray()
        self._oldest_at: float | None = None
        self._dropped = 0
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._read, name=thread_name, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while True:
                data = os.read(self._fd, 65536)
                if not data:
                    break
                with self._lock:
                    if len(self._buffer) + len(data) > self._max_buffer:
                        self._dropped += len(data)
                        continue
                    if not self._buffer:
                        self._oldest_at = time.monotonic()
                    self._buffer += data
        except OSError:
            pass
        finally:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self.done.set()

    def take(self, *, force: bool, flush_s: float, chunk_bytes: int) -> list[str]:
        """Text chunks due for shipping: at least `chunk_bytes` waiting, or `flush_s` old."""
        with self._lock:
            if not self._buffer and not self._dropped:
                return []
            age = time.monotonic() - (self._oldest_at or time.monotonic())
            if not force and len(self._buffer) < chunk_bytes and age < flush_s:
                return []
            pieces: list[bytes] = []
            while self._buffer:
                piece = bytes(self._buffer[:chunk_bytes])
                if len(self._buffer) > chunk_bytes:
                    newline = piece.rfind(b"\n")
                    if newline >= 0:
                        piece = piece[: newline + 1]
                del self._buffer[: len(piece)]
                pieces.append(piece)
            dropped, self._dropped = self._dropped, 0
            self._oldest_at = None
        final = force and self.done.is_set()
        texts = [self._decoder.decode(p) for p in pieces]
        if final:
            texts.append(self._decoder.decode(b"", final=True))
        if dropped:
            texts.append(f"\n[agent: {dropped} bytes of {self.name} dropped: output too fast]\n")
        return [t for t in texts if t]


# ---------------------------------------------------------------------------------------------
# jobs
# ---------------------------------------------------------------------------------------------


@dataclass
class Job:
    """One attempt of one job on this node."""

    assignment: Assignment
    launch: Launch | None = None
    started_at: float | None = None  # the runner's clock, for the time limit
    proc: subprocess.Popen[bytes] | None = None
    pid: int | None = None
    start_ticks: int | None = None
    streams: list[_Stream] = field(default_factory=list)
    seq: int = 0
    returncode: int | None = None
    leader_exited_at: float | None = None
    group_gone_at: float | None = None
    stop_reason: str | None = None  # the exit reason a stop reports: preempted/cancelled/killed
    stop_message: str = ""
    grace_s: float = 0.0
    kill_at: float | None = None
    kill_sent: bool = False
    killed_hard: bool = False
    leftovers_stopped: bool = False
    forgotten: bool = False
    finished: bool = False
    plan: Plan | None = None  # its storage on this host
    settled: bool = False  # the runtime finished its start (the container's env file is gone)
    exit_reason: str | None = None  # as reported

    @property
    def key(self) -> tuple[int, int]:
        return self.assignment.key

    @property
    def job_id(self) -> int:
        return self.assignment.job_id

    @property
    def attempt(self) -> int:
        return self.assignment.attempt

    @property
    def alive(self) -> bool:
        """Some process of this attempt may still run."""
        return self.proc is not None and self.group_gone_at is None


class Runner:
    """Starts and stops the node's work and queues what the portal must hear about it."""

    def __init__(
        self,
        workdir: str | Path,
        *,
        log_flush_s: float = 1.0,
        log_chunk_bytes: int = 16 * 1024,
        max_buffer_bytes: int = 4 * 1024 * 1024,
        max_queued_log_messages: int = 256,
        base_env: Mapping[str, str] | None = None,
        clock: Callable[[], float] = time.monotonic,
        shell: str = "/bin/sh",
        job_pythonpath: str | None = agent_source_root(),
        runtime: Runtime | None = None,
        shared_root: str | Path | None = None,
        project_gid_base: int = DEFAULT_PROJECT_GID_BASE,
        quota_interval_s: float = 15.0,
        volume_images: bool = True,
    ) -> None:
        self.workdir = Path(workdir)
        self.runtime = runtime or ProcessRuntime(shell=shell)
        # Every host path of a job comes from here (and the shared root), never from the portal.
        self.storage = Storage(
            self.workdir,
            shared_root=Path(shared_root) if shared_root else None,
            project_gid_base=project_gid_base,
            images=volume_images,
        )
        self.storage.ensure_layout()
        if hasattr(self.runtime, "state_dir"):
            self.runtime.state_dir = self.workdir / "run"
        self.quota_interval_s = quota_interval_s
        self._next_quota_check = 0.0
        self._meter: threading.Thread | None = None  # measures volumes (check_quotas)
        self._usage: dict[str, int] = {}  # its last results, by volume
        self._usage_lock = threading.Lock()
        # job id -> when its last attempt here ended (stopped, so it may come back): its
        # workspace stays while the portal still assigns the job here (`release_workspaces`)
        self._parked: dict[int, float] = {}
        self.log_flush_s = log_flush_s
        self.log_chunk_bytes = log_chunk_bytes
        self.max_buffer_bytes = max_buffer_bytes
        self.max_queued_log_messages = max_queued_log_messages
        self.base_env = dict(os.environ if base_env is None else base_env)
        self.shell = shell
        self.job_pythonpath = job_pythonpath
        self._clock = clock
        self.jobs: dict[tuple[int, int], Job] = {}
        self.outbox: deque[Message] = deque()
        self._finished: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.state_file = self.workdir / STATE_FILE_NAME

    # -- queries -------------------------------------------------------------------------------

    def knows(self, key: tuple[int, int]) -> bool:
        """This attempt runs here now or ran here before: never start it (again)."""
        return key in self.jobs or key in self._finished

    def alive_jobs(self) -> list[Job]:
        return [j for j in self.jobs.values() if j.alive]

    def running(self) -> list[dict[str, Any]]:
        """The heartbeat's `running`: every started attempt whose exit is not yet reported."""
        return [
            {"job_id": j.job_id, "attempt": j.attempt, "pid": j.pid}
            for j in self.jobs.values()
            if j.pid is not None
        ]

    def busy_gpus(self) -> set[str]:
        return {u for j in self.alive_jobs() for u in j.assignment.gpu_uuids}

    def processes_by_gpu(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for j in self.alive_jobs():
            for u in j.assignment.gpu_uuids:
                if j.pid is not None:
                    out.setdefault(u, []).append(j.pid)
        return out

    @property
    def idle(self) -> bool:
        """Nothing runs and nothing is left to tell the portal."""
        return not self.jobs and not self.outbox

    # -- environment and directories ----------------------------------------------------------

    def working_dir(self, a: Assignment) -> Path:
        """The job's workspace on this host: always `<workdir>/jobs/<job id>` (the
        assignment's `working_dir` is a path in the container)."""
        return self.workdir / "jobs" / str(a.job_id)

    def checkpoint_dir(self, a: Assignment) -> Path | None:
        """Where the job's checkpoint is on this host: a path inside one of its volumes."""
        try:
            return self.storage.plan(a).checkpoint_host()
        except StorageError:
            return None

    def job_env(self, a: Assignment) -> dict[str, str]:
        """The job's environment, an allow-list: a few basics, what the job asked for and what
        the platform sets (its env from the portal), the GPU fence. Nothing of the agent's.
        CHECKPOINT_DIR and VOLUME_<NAME> are the runtime's (where the job sees its volumes):
        a host path the portal may still send is dropped."""
        env = {"PATH": JOB_PATH}
        env.update({k: self.base_env[k] for k in BASE_ENV_KEYS if k in self.base_env})
        env.update(
            {
                k: v
                for k, v in a.env.items()
                if k not in PRIVATE_ENV and k != "CHECKPOINT_DIR" and not k.startswith("VOLUME_")
            }
        )
        if self.job_pythonpath:
            paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
            if self.job_pythonpath not in paths:
                env["PYTHONPATH"] = os.pathsep.join([*paths, self.job_pythonpath])
        if env.get("MASTER_ADDR") and not env.get("MASTER_PORT"):
            env["MASTER_PORT"] = str(free_port())  # one node's rendezvous: a port free here
        # Set last, so nothing in the job's own env can widen its view of the node's GPUs.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(a.gpu_uuids)
        for key in PER_JOB_CUDA_ENV - {"CUDA_VISIBLE_DEVICES"}:
            env.pop(key, None)
        if a.gpu_uuids and a.share_milli < 1000:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(a.share_milli / 10)))
            if a.gpu_memory_limit_mib:
                # Device ordinals as the client sees them (after CUDA_VISIBLE_DEVICES).
                env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                    f"{i}={a.gpu_memory_limit_mib}M" for i in range(len(a.gpu_uuids))
                )
        return env

    # -- start ---------------------------------------------------------------------------------

    def start(self, a: Assignment) -> Job:
        """Start an attempt; a start that fails is reported as `failed_to_start`."""
        if self.knows(a.key):
            raise ValueError(f"job {a.job_id} attempt {a.attempt} is already known here")
        job = Job(assignment=a, grace_s=a.grace_seconds)
        rank = a.env.get("NODE_RANK", "0")
        if rank.isdigit() and a.env.get("NNODES", "1") != "1":  # a gang member's own numbers
            job.seq = int(rank) * protocol.LOG_SEQ_PER_MEMBER
        self.jobs[a.key] = job
        self._parked.pop(a.job_id, None)
        try:
            if not a.command.strip():
                raise ValueError("the assignment has no command")
            # Checked and placed here; created by the runtime as the job's uid is known.
            job.plan = self.storage.plan(a)
            launch = self.runtime.launch(a, plan=job.plan, env=self.job_env(a))
            job.launch = launch
            argv, switch = _switch_user(launch)
            proc = subprocess.Popen(  # noqa: S603 - running the portal's command is the point
                argv,
                cwd=launch.cwd,
                env=launch.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                bufsize=0,
                start_new_session=True,
                close_fds=True,
                **switch,
            )
        except (OSError, ValueError, subprocess.SubprocessError, LaunchError) as exc:
            # (StorageError is a ValueError: a volume or path the agent will not use)
            log.error("job %d attempt %d failed to start: %s", a.job_id, a.attempt, exc)
            self._queue(job, "exited", self._exit_body(job, "failed_to_start", str(exc)))
            self._retire(job)
            return job
        job.started_at = self._clock()
        job.proc = proc
        job.pid = proc.pid
        job.start_ticks = process_start_ticks(proc.pid)
        assert proc.stdout is not None and proc.stderr is not None
        for name, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            fd = os.dup(pipe.fileno())
            pipe.close()
            job.streams.append(
                _Stream(
                    name,
                    fd,
                    max_buffer=self.max_buffer_bytes,
                    thread_name=f"job-{a.job_id}.{a.attempt}-{name}",
                )
            )
        log.info(
            "job %d attempt %d started: pid %d, GPUs %s",
            a.job_id,
            a.attempt,
            proc.pid,
            ",".join(a.gpu_uuids) or "none",
        )
        started: protocol.Started = {"attempt": a.attempt, "pid": proc.pid}
        if launch.image_digest:
            started["image_digest"] = launch.image_digest
        self._queue(job, "started", dict(started))
        self._save_state()
        return job

    def reject(self, a: Assignment, message: str) -> None:
        """Refuse an attempt without starting it; it is reported as `failed_to_start`."""
        job = Job(assignment=a)
        self.jobs[a.key] = job
        log.error("job %d attempt %d not started: %s", a.job_id, a.attempt, message)
        self._queue(job, "exited", self._exit_body(job, "failed_to_start", message))
        self._retire(job)

    # -- stop ----------------------------------------------------------------------------------

    def stop(
        self,
        key: tuple[int, int],
        reason: str = "killed",
        message: str = "",
        *,
        grace_s: float | None = None,
        request: str | None = None,
    ) -> bool:
        """SIGTERM the attempt's process group now, SIGKILL it after the grace (see `poll`).

        Just before the SIGTERM, the checkpoint signal file (`protocol.STOP_FILE`) says why
        (`request`: the portal's stop reason, else `reason`) and by when. A second stop keeps
        the first reason and may only shorten the grace.
        """
        job = self.jobs.get(key)
        if job is None or not job.alive:
            return False
        grace = job.assignment.grace_seconds if grace_s is None else grace_s
        deadline = self._clock() + max(0.0, grace)
        if job.stop_reason is None:
            job.stop_reason = reason
            job.stop_message = message or reason
            job.grace_s = grace
            job.kill_at = deadline
            log.info(
                "stopping job %d attempt %d (%s): SIGTERM, SIGKILL in %gs",
                job.job_id,
                job.attempt,
                job.stop_message,
                grace,
            )
            assert job.pid is not None
            self._request_checkpoint(job, request or reason, grace)
            self._signal(job, signal.SIGTERM)
        elif job.kill_at is None or deadline < job.kill_at:
            job.kill_at = deadline
            job.grace_s = grace
        return True

    def _request_checkpoint(self, job: Job, reason: str, grace: float) -> None:
        """Write the checkpoint signal file into the job's checkpoint directory (whole, by a
        rename, so a workload polling it never reads half of it; under a directory descriptor
        and link-free: a symlink the job planted there is replaced, never written through).
        Best effort: the SIGTERM follows whatever happens here."""
        plan = job.plan
        if plan is None or plan.checkpoint is None or not plan.prepared:
            return
        deadline = time.time() + max(0.0, grace)
        body = {
            "reason": reason,
            "message": job.stop_message,
            "grace_seconds": grace,
            "deadline": round(deadline, 3),
            "deadline_iso": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline)),
            "job_id": job.job_id,
            "attempt": job.attempt,
        }
        owner = job.launch.owner if job.launch is not None else None
        try:
            self.storage.write_stop_file(
                plan, (json.dumps(body) + "\n").encode(), uid=-1 if owner is None else owner
            )
        except OSError as exc:
            log.warning("job %d: cannot write its stop request: %s", job.job_id, exc)

    def stop_all(self, reason: str, message: str, *, grace_s: float | None = None) -> int:
        """Stop every attempt on the node; the number being stopped."""
        return sum(self.stop(j.key, reason, message, grace_s=grace_s) for j in self.alive_jobs())

    def forget(self, key: tuple[int, int], why: str = "stale attempt") -> None:
        """The portal no longer knows this attempt: stop it, say nothing more about it."""
        self.outbox = deque(m for m in self.outbox if m.key != key)
        job = self.jobs.get(key)
        if job is None:
            return
        log.warning("forgetting job %d attempt %d: %s", job.job_id, job.attempt, why)
        job.forgotten = True
        if job.alive:
            self.stop(key, "killed", why)
        else:
            self._retire(job)

    # -- the loop ------------------------------------------------------------------------------

    def poll(self) -> None:
        """Reap exits, escalate stops, ship due log chunks, queue exit reports."""
        now = self._clock()
        if now >= self._next_quota_check:
            self._next_quota_check = now + self.quota_interval_s
            self.check_quotas()
        for job in list(self.jobs.values()):
            if job.proc is None:
                continue
            if not job.settled and job.launch is not None:
                job.settled = self.runtime.settle(job.launch)
            self._advance(job, now)
            if job.forgotten:
                if not job.alive:
                    self._retire(job)
                continue
            self._ship_logs(job, force=False)
            if not job.alive and self._streams_done(job, now):
                self._ship_logs(job, force=True)
                body = self._final_exit_body(job)
                if job.launch is not None:
                    outcome = self.runtime.outcome(job.launch, job.returncode)
                    if outcome is not None and job.stop_reason is None:
                        body = {**body, "reason": outcome.reason, "message": outcome.message}
                self._queue(job, "exited", body)
                self._retire(job)

    def kill_now(self, job: Job) -> None:
        """SIGKILL everything of the attempt now and remove what holds it (its container)."""
        if job.pid is not None:
            self._signal(job, signal.SIGKILL)
        if job.launch is not None:
            self.runtime.cleanup(job.launch)

    def _signal(self, job: Job, sig: int) -> bool:
        assert job.pid is not None
        if job.launch is None:
            return signal_group(job.pid, sig)
        return self.runtime.signal(job.launch, job.pid, sig)

    def _advance(self, job: Job, now: float) -> None:
        assert job.proc is not None and job.pid is not None
        limit = job.assignment.time_limit_s
        if (
            limit
            and job.stop_reason is None
            and job.returncode is None
            and job.started_at is not None
            and now - job.started_at >= limit
        ):
            self.stop(
                job.key,
                "time_limit",
                f"time limit: the job ran past its limit of {limit}s",
                grace_s=min(job.assignment.grace_seconds, 30.0),
            )
        if job.returncode is None:
            returncode = job.proc.poll()
            if returncode is not None:
                job.returncode = returncode
                job.leader_exited_at = now
                log.info(
                    "job %d attempt %d: main process ended, %s",
                    job.job_id,
                    job.attempt,
                    _describe_status(returncode),
                )
        if job.kill_at is not None and now >= job.kill_at and not job.kill_sent:
            job.kill_sent = True
            if self._signal(job, signal.SIGKILL):
                job.killed_hard = True
                log.warning(
                    "job %d attempt %d outlived SIGTERM by %gs: SIGKILL",
                    job.job_id,
                    job.attempt,
                    job.grace_s,
                )
        if job.returncode is None or job.group_gone_at is not None:
            return
        if not group_members(job.pid):
            job.group_gone_at = now
            return
        if job.stop_reason is None and not job.leftovers_stopped:
            # The main process is done; whatever it left behind must not outlive the job.
            job.leftovers_stopped = True
            job.kill_at = now + LEFTOVER_GRACE_S
            job.grace_s = LEFTOVER_GRACE_S
            self._signal(job, signal.SIGTERM)
        elif job.kill_sent and job.kill_at is not None and now >= job.kill_at + READER_DRAIN_S:
            job.group_gone_at = now  # unkillable (D state) or zombie-only: give up waiting

    def _streams_done(self, job: Job, now: float) -> bool:
        if all(s.done.is_set() for s in job.streams):
            return True
        # A process that left the group (setsid) can hold the pipes open: do not wait forever.
        return job.group_gone_at is not None and now - job.group_gone_at >= READER_DRAIN_S

    def _ship_logs(self, job: Job, *, force: bool) -> None:
        if not force:
            queued = sum(1 for m in self.outbox if m.kind == "logs")
            if queued >= self.max_queued_log_messages:
                return  # the portal is slow or away; the stream buffers hold (and cap) the rest
        for stream in job.streams:
            for text in stream.take(
                force=force, flush_s=self.log_flush_s, chunk_bytes=self.log_chunk_bytes
            ):
                body = {"attempt": job.attempt, "seq": job.seq, "stream": stream.name, "text": text}
                job.seq += 1
                self._queue(job, "logs", body)

    def _final_exit_body(self, job: Job) -> dict[str, Any]:
        returncode = job.returncode
        status = _describe_status(returncode) if returncode is not None else "status unknown"
        if job.stop_reason is not None:
            how = (
                f"SIGKILL after {job.grace_s:g}s grace"
                if job.killed_hard
                else "ended after SIGTERM"
            )
            message = f"{job.stop_message}: {how}; {status}"
            reason = job.stop_reason
        else:
            message = status
            if job.leftovers_stopped:
                message += "; leftover background processes were stopped"
            reason = "exited"
        return self._exit_body(job, reason, message)

    @staticmethod
    def _exit_body(job: Job, reason: str, message: str) -> dict[str, Any]:
        rc = job.returncode
        return {
            "attempt": job.attempt,
            "exit_code": rc if rc is not None and rc >= 0 else None,
            "signal": -rc if rc is not None and rc < 0 else None,
            "reason": reason,
            "message": message,
        }

    def _queue(self, job: Job, kind: str, body: dict[str, Any]) -> None:
        if kind == "exited":
            job.exit_reason = body.get("reason")
        self.outbox.append(Message(job.job_id, job.attempt, kind, body))

    def _retire(self, job: Job) -> None:
        if job.launch is not None and not job.finished:
            self.runtime.cleanup(job.launch)  # nothing of the attempt outlives it
        if not job.finished and not any(
            j.job_id == job.job_id and j is not job for j in self.jobs.values()
        ):
            self._give_back(job)
        job.finished = True
        self.jobs.pop(job.key, None)
        self._finished[job.key] = None
        while len(self._finished) > 10_000:
            self._finished.popitem(last=False)
        self._save_state()

    # -- storage: quotas and giving space back -------------------------------------------------

    def _give_back(self, job: Job) -> None:
        """The attempt is over: its scratch goes now; its workspace too, unless it was stopped
        (preempted, resized, no longer assigned), when it may come back here at once."""
        self.storage.remove_scratch(job.job_id)
        if job.exit_reason in ("preempted", "killed"):
            self._parked[job.job_id] = self._clock()
        else:
            self.storage.remove_workspace(job.job_id)

    def release_workspaces(self, assigned: Set[int]) -> list[int]:
        """Remove the workspaces of stopped jobs the portal no longer assigns here."""
        gone = [j for j in self._parked if j not in assigned]
        for job_id in gone:
            del self._parked[job_id]
            if not any(j.job_id == job_id for j in self.jobs.values()):
                self.storage.remove_workspace(job_id)
        return gone

    def remove_volumes(self, volume_ids: list[int]) -> list[int]:
        """Remove node-local volumes the portal deleted (not while an attempt mounts one)."""
        in_use = {
            m.volume.id
            for j in self.jobs.values()
            if j.plan is not None
            for m in j.plan.mounts
            if m.volume.kind == "node_local"
        }
        removed = []
        for volume_id in volume_ids:
            if volume_id in in_use:
                continue
            if self.storage.remove_volume(volume_id):
                log.info("removed node-local volume v%d (deleted in the portal)", volume_id)
                removed.append(volume_id)
        return removed

    def sweep(self) -> list[str]:
        """Remove what no live attempt here owns (a crashed agent's job dirs and scratch)."""
        removed = self.storage.sweep({j.job_id for j in self.jobs.values()})
        if removed:
            log.warning("removed %d leftover job director(ies): %s", len(removed), removed[:10])
        return removed

    def _writers(self) -> dict[str, tuple[Mount, list[Job]]]:
        """The volumes with a limit that running attempts write to, and those attempts."""
        writers: dict[str, tuple[Mount, list[Job]]] = {}
        for job in self.alive_jobs():
            if job.plan is None or not job.plan.prepared or job.stop_reason is not None:
                continue
            for m in job.plan.mounts:
                if not m.volume.read_only and m.volume.limit_mib > 0:
                    writers.setdefault(m.key, (m, []))[1].append(job)
        return writers

    def check_quotas(self) -> list[tuple[int, int]]:
        """Stop the attempts writing to a volume the last measurement found over 110% of its
        limit (the attempts stopped), and start the next measurement of every such volume.
        Measuring walks what jobs wrote (any number of files): it runs on a thread of its
        own, so a job cannot slow the agent's loop down with it."""
        stopped = []
        with self._usage_lock:
            measured, self._usage = self._usage, {}
        for key, (m, jobs) in self._writers().items():
            used = measured.get(key)
            if used is None or not self.storage.over_limit(m, used):
                continue
            message = f"volume full: volume {m.volume.name} is full (limit {m.volume.limit_text})"
            for job in jobs:
                grace = min(job.assignment.grace_seconds, 30.0)
                if self.stop(job.key, "volume_full", message, grace_s=grace):
                    stopped.append(job.key)
        if self._meter is None or not self._meter.is_alive():
            mounts = [m for m, _ in self._writers().values()]
            if mounts:
                self._meter = threading.Thread(
                    target=self._measure, args=(mounts,), name="volume-usage", daemon=True
                )
                self._meter.start()
        return stopped

    def _measure(self, mounts: list[Mount]) -> None:
        usage = {}
        for m in mounts:
            try:
                usage[m.key] = self.storage.usage(m)
            except OSError as exc:
                log.warning("cannot measure volume %s: %s", m.volume.name, exc)
        with self._usage_lock:
            self._usage.update(usage)

    def wait_all(self, timeout_s: float, *, tick_s: float = 0.05) -> bool:
        """Poll until no attempt has a process left (True), or the timeout passes."""
        deadline = time.monotonic() + timeout_s
        while any(j.alive for j in self.jobs.values()):
            if time.monotonic() >= deadline:
                return False
            time.sleep(tick_s)
            self.poll()
        self.poll()
        return True

    # -- surviving an agent crash ---------------------------------------------------------------

    def _save_state(self) -> None:
        """Which process groups are ours, so a restarted agent can clean up after a crash."""
        records = [
            {
                "job_id": j.job_id,
                "attempt": j.attempt,
                "pgid": j.pid,
                "start_ticks": j.start_ticks,
            }
            for j in self.jobs.values()
            if j.pid is not None
        ]
        tmp = self.state_file.with_suffix(".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # the agent's only
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({"boot_id": _boot_id(), "groups": records}))
            os.replace(tmp, self.state_file)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.state_file, exc)

    def kill_leftovers(self, grace_s: float = 10.0) -> list[Message]:
        """Stop process groups a previous agent on this host left running (it crashed).

        Their pipes died with that agent, so they can be neither watched nor logged: SIGTERM,
        the grace, SIGKILL (containers: removed). Their exit reports are queued in the outbox
        (and returned).
        """
        reports: list[Message] = []
        for job_id, attempt in self.runtime.leftovers():
            if (job_id, attempt) in self._finished:
                continue
            reports.append(
                Message(
                    job_id,
                    attempt,
                    "exited",
                    {
                        "attempt": attempt,
                        "exit_code": None,
                        "signal": None,
                        "reason": "killed",
                        "message": "the node agent restarted; the attempt's container was removed",
                    },
                )
            )
            self._finished[(job_id, attempt)] = None
        self.outbox.extend(reports)
        try:
            state = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return reports
        if state.get("boot_id") != _boot_id():
            return reports  # the host rebooted: no process of ours survived
        container_reports, reports = reports, []
        groups: list[int] = []
        for record in state.get("groups", []):
            pgid = int(record["pgid"])
            leader = _proc_stat(pgid)
            if leader is not None and leader[3] != record.get("start_ticks"):
                continue  # the id belongs to some other process now
            if not group_members(pgid):
                continue
            log.warning(
                "stopping job %s attempt %s (process group %d) left behind by a previous agent",
                record["job_id"],
                record["attempt"],
                pgid,
            )
            signal_group(pgid, signal.SIGTERM)
            groups.append(pgid)
            reports.append(
                Message(
                    int(record["job_id"]),
                    int(record["attempt"]),
                    "exited",
                    {
                        "attempt": int(record["attempt"]),
                        "exit_code": None,
                        "signal": None,
                        "reason": "killed",
                        "message": "the node agent restarted; the attempt's processes were stopped",
                    },
                )
            )
            self._finished[(int(record["job_id"]), int(record["attempt"]))] = None
        deadline = time.monotonic() + grace_s
        while groups and time.monotonic() < deadline:
            groups = [g for g in groups if group_members(g)]
            time.sleep(0.05)
        for pgid in groups:
            signal_group(pgid, signal.SIGKILL)
        self.outbox.extend(reports)
        self._save_state()
        return container_reports + reports


def stop_reason_to_exit_reason(stop_reason: str | None) -> str:
    return EXIT_REASON_BY_STOP_REASON.get(stop_reason, "killed")
