"""What every workload runtime provides, and the pieces they share."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from agent.storage import Plan


class Assignment(Protocol):
    """What a runtime reads of an assignment (`agent.runner.Assignment` has it)."""

    @property
    def job_id(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def command(self) -> str: ...
    @property
    def gpu_uuids(self) -> Sequence[str]: ...
    @property
    def share_milli(self) -> int: ...
    @property
    def gpu_memory_limit_mib(self) -> int | None: ...
    @property
    def image(self) -> str: ...
    @property
    def cpu_milli(self) -> int: ...
    @property
    def memory_mib(self) -> int: ...
    @property
    def shm_mib(self) -> int: ...


# Jobs run as uid/gid JOB_UID_BASE + (job id mod JOB_UID_RANGE): never the agent's, never root.
# Two jobs whose ids are JOB_UID_RANGE apart would share it: `JobUids` gives the second the next
# uid no live attempt on the node holds.
DEFAULT_JOB_UID_BASE = 200_000
JOB_UID_RANGE = 60_000


def job_uid_range(base: int | None) -> range | None:
    """Every uid a job may run as on the node (None: jobs do not switch uids)."""
    return None if base is None else range(base, base + JOB_UID_RANGE)


def job_uid(job_id: int, base: int = DEFAULT_JOB_UID_BASE) -> int:
    """The uid a job runs as when no other job on the node holds it."""
    return base + job_id % JOB_UID_RANGE


class JobUids:
    """The job uids that live attempts on this node hold.

    A job's uid is `job_uid(job id)`, the same on every node and for every attempt (so a
    requeued attempt reads the checkpoint files an earlier one wrote), unless an attempt of
    another job holds it now: ids JOB_UID_RANGE apart meet on one node once a portal has run
    that many jobs, and two jobs under one uid could read each other's files, and the end of
    one would kill the other's processes (`kill_uid`). That second job gets the next uid that
    nothing holds. Starts and ends come from the agent's loop; the lock keeps it safe anyway.
    """

    def __init__(self, base: int, *, size: int = JOB_UID_RANGE) -> None:
        self.base = base
        self.size = size
        self._holders: dict[int, tuple[int, int]] = {}  # uid -> (job id, attempts holding it)
        self._lock = threading.Lock()

    def acquire(self, job_id: int) -> int:
        with self._lock:
            for step in range(self.size):
                uid = self.base + (job_id + step) % self.size
                holder, count = self._holders.get(uid, (job_id, 0))
                if holder == job_id:
                    self._holders[uid] = (job_id, count + 1)
                    return uid
        raise LaunchError(f"all {self.size:,} job uids are held by running attempts")

    def release(self, uid: int | None) -> None:
        """An attempt that ran as `uid` is over (None: it never switched uid)."""
        if uid is None:
            return
        with self._lock:
            job_id, count = self._holders.pop(uid, (0, 0))
            if count > 1:
                self._holders[uid] = (job_id, count - 1)


class LaunchError(Exception):
    """The attempt cannot start (a missing image, no default image...): `failed_to_start`."""


@dataclass(frozen=True)
class Outcome:
    """How an attempt ended when the runtime knows better than the exit status."""

    reason: str  # an exit reason of agent.protocol.EXIT_REASONS
    message: str


@dataclass
class Launch:
    """What the runner starts for one attempt, and what the runtime must remember of it."""

    argv: list[str]
    env: dict[str, str]
    cwd: Path
    user: int | None = None  # switch to this uid/gid (the process runtime as root)
    group: int | None = None
    groups: tuple[int, ...] = ()  # supplementary groups after the switch (the project's gid)
    owner: int | None = None  # the job's uid, whichever runtime (files written for the job)
    image: str = ""
    image_digest: str = ""
    container: str = ""  # the container's name (the container runtime)
    memory_mib: int = 0
    extra: dict[str, str] = field(default_factory=dict)


class Runtime:
    """The interface; `ProcessRuntime` and `ContainerRuntime` implement it."""

    name = "runtime"

    def launch(self, a: Assignment, *, plan: Plan, env: dict[str, str]) -> Launch:
        """Prepare the attempt's storage (`plan.prepare` with the job's uid) and say what to
        run."""
        raise NotImplementedError

    def settle(self, launch: Launch) -> bool:
        """Called after the start until True: the attempt's start is complete, and what only
        the start needed (the container's env file) is gone."""
        return True

    def signal(self, launch: Launch, pgid: int, sig: int) -> bool:
        """Send `sig` to everything of the attempt; False when nothing is left."""
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def outcome(self, launch: Launch, returncode: int | None) -> Outcome | None:
        """After the main process ended: a reason the exit status does not tell (OOM)."""
        return None

    def cleanup(self, launch: Launch) -> None:
        """The attempt is over: nothing of it may remain (processes, containers)."""

    def leftovers(self) -> list[tuple[int, int]]:
        """Stop what a previous agent on this host left running; the (job, attempt)s stopped."""
        return []

    def describe(self) -> str:
        return self.name

    def gang_members(self) -> str | None:
        """Why this runtime cannot run a member of a multi-node gang here, or None when it
        can (told at registration, so the portal places gang members only where they run)."""
        return None

    def keep_pulled(self, images: list[str]) -> None:
        """Have these images on the node before a job asks for them (the portal's curated
        images, told in each heartbeat answer); nothing to do without a container engine."""


def open_parent(path: Path) -> None:
    """Let job uids traverse (not list) a directory above their own dirs."""
    with contextlib.suppress(OSError):
        os.chmod(path, (path.stat().st_mode & 0o7777 & ~0o077) | 0o011)  # noqa: S103 - x only


def kill_uid(uid: int, sig: int = signal.SIGKILL, *, node_rank: str | None = None) -> int:
    """Signal every process owned by `uid` (a job's own uid): what left its process group
    (`setsid`) cannot outlive the job. The number signalled.

    `node_rank`: the attempt is one member of a gang; only processes whose environment names
    this member (`NODE_RANK`, which its children inherit) are signalled: simulated nodes on one
    host run a gang's members under the same uid, and one member's end must not kill the
    others — nor another member's child caught between fork and exec, whose environment is
    still the agent's."""
    if uid == 0 or uid == os.getuid():
        return 0  # never the agent's own processes
    count = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            owner = entry.stat().st_uid
        except OSError:
            continue
        if owner != uid:
            continue
        if node_rank is not None and not _this_member(entry, node_rank):
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(entry.name), sig)
            count += 1
    return count


def _this_member(proc: Path, node_rank: str) -> bool:
    """The process's environment names the gang member `node_rank`."""
    try:
        environ = (proc / "environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"NODE_RANK={node_rank}".encode() in environ
