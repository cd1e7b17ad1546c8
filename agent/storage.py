"""Where a job's files live on the node: derived only from the agent's configuration and ids.

The portal sends ids, kinds, container paths and limits (agent.protocol `Assignment.volumes`,
`checkpoint`, `working_dir`); it never names a host path, and any it still sends
(`checkpoint_dir`, a `CHECKPOINT_DIR` in the env) is ignored. The host layout, all created by
the agent as root and never through a symlink (agent/hostfs.py):

    <workdir>/jobs/<job_id>            the job's workspace (/workspace), mode 0700, its uid
    <workdir>/scratch/<job_id>/<name>  scratch volumes, removed when the attempt ends
    <workdir>/volumes/v<id>            node-local volumes, removed when the portal deletes them
    <shared_root>/v<id>                shared volumes and datasets (the operator's mount)
    <workdir>/run/                     the agent's own (0700): state and env files

Volume directories are root:<project gid> 2770 (setgid): every job of the project runs with
that supplementary gid (`project_gid_base + project_id`) and a umask that keeps files
group-writable, so the project's jobs share a volume's files whatever their job uid.
Anything that does not fit (a name, a path with `..`, a kind) is a `StorageError`: the attempt
fails to start with that message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import hostfs, loopfs
from agent.protocol import DEFAULT_WORKING_DIR as WORKSPACE
from agent.protocol import STOP_FILE

VOLUME_KINDS = ("scratch", "node_local", "shared")
DEFAULT_PROJECT_GID_BASE = 300_000  # above the job uids (200000 + 60000)
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,99}\Z")
_PART = re.compile(r"[A-Za-z0-9._@+=-]+\Z")
# Container paths a volume may not cover (the engine's own, and the job's workspace).
_RESERVED = ("/proc", "/sys", "/dev", WORKSPACE, "/opt/gpucloud")
log = logging.getLogger(__name__)
_OVER_LIMIT = 1.10  # a volume measured over 110% of its limit stops the jobs writing to it


class StorageError(ValueError):
    """What the portal sent for a job's storage cannot be honoured (failed_to_start)."""


def container_path(value: object, what: str) -> str:
    """An absolute, normalized path in the container (no `..`, no odd characters)."""
    if not isinstance(value, str) or not value.startswith("/"):
        raise StorageError(f"{what} must be an absolute path in the container, not {value!r}")
    parts = [p for p in value.split("/") if p]
    if not parts or any(p in (".", "..") or not _PART.match(p) for p in parts):
        raise StorageError(
            f"{what} {value!r} is not a usable path in the container "
            "(letters, digits and . _ - @ + = only; no '..')"
        )
    return "/" + "/".join(parts)


def inside_path(value: object, what: str) -> str:
    """A relative path inside a volume ("" : its root): no leading '/', no `..`."""
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or value.startswith("/"):
        raise StorageError(f"{what} must be a path relative to its volume, not {value!r}")
    parts = [p for p in value.split("/") if p]
    if any(p in (".", "..") or not _PART.match(p) for p in parts):
        raise StorageError(f"{what} {value!r} is not a usable path inside a volume (no '..')")
    return "/".join(parts)


def _under(path: str, parent: str) -> bool:
    return path.startswith(parent.rstrip("/") + "/")


def _int(value: object, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise StorageError(f"{what} must be an integer >= {minimum}, not {value!r}")
    return value


@dataclass(frozen=True)
class Volume:
    """One volume of an assignment, checked."""

    id: int
    name: str
    kind: str
    mount_path: str
    read_only: bool
    limit_mib: int

    @classmethod
    def from_wire(cls, raw: object) -> Volume:
        if not isinstance(raw, Mapping):
            raise StorageError(f"a volume must be an object, not {raw!r}")
        name = raw.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise StorageError(f"volume name {name!r} is not a volume name")
        kind = raw.get("kind")
        if kind not in VOLUME_KINDS:
            raise StorageError(f"volume {name}: unknown kind {kind!r}")
        volume_id = _int(raw.get("id", 0), f"volume {name}: id")
        if kind != "scratch" and volume_id < 1:
            raise StorageError(f"volume {name}: a {kind} volume needs its id")
        mount = container_path(raw.get("mount_path") or f"/data/{name}", f"volume {name}: path")
        if mount == "/" or any(mount == r or _under(mount, r) for r in _RESERVED):
            raise StorageError(f"volume {name}: {mount} is reserved in the container")
        read_only = raw.get("read_only", False)
        if not isinstance(read_only, bool):
            raise StorageError(f"volume {name}: read_only must be true or false")
        limit = _int(raw.get("limit_mib") or 0, f"volume {name}: limit_mib")
        return cls(volume_id, name, str(kind), mount, read_only, limit)

    @property
    def limit_text(self) -> str:
        gib, mib = divmod(self.limit_mib, 1024)
        return f"{gib} GiB" if not mib else f"{self.limit_mib} MiB"


@dataclass(frozen=True)
class Mount:
    """A volume and where it lives on this host: `base` (a directory of the agent's
    configuration) and `below` (created by the agent, taken link-free)."""

    volume: Volume
    base: Path
    below: str

    @property
    def host(self) -> Path:
        return self.base / self.below

    @property
    def key(self) -> str:
        return str(self.host)


@dataclass
class Plan:
    """An attempt's storage: checked and placed, not yet created (`prepare`)."""

    storage: Storage
    job_id: int
    project_gid: int | None
    working_dir: str  # in the container
    mounts: tuple[Mount, ...] = ()
    checkpoint: Mount | None = None
    checkpoint_path: str = ""  # inside the checkpoint's volume
    prepared: bool = field(default=False, compare=False)

    @property
    def workspace(self) -> Path:
        return self.storage.workdir / "jobs" / str(self.job_id)

    def checkpoint_host(self) -> Path | None:
        if self.checkpoint is None:
            return None
        return (
            self.checkpoint.host / self.checkpoint_path
            if self.checkpoint_path
            else self.checkpoint.host
        )

    def checkpoint_container(self) -> str | None:
        if self.checkpoint is None:
            return None
        path = self.checkpoint.volume.mount_path
        return f"{path}/{self.checkpoint_path}" if self.checkpoint_path else path

    def env(self, *, in_container: bool) -> dict[str, str]:
        """CHECKPOINT_DIR and VOLUME_<NAME> as the job sees them (container paths, or the host
        paths where the job runs as a plain process)."""
        out: dict[str, str] = {}
        for m in self.mounts:
            key = "VOLUME_" + m.volume.name.upper().replace("-", "_")
            out[key] = m.volume.mount_path if in_container else str(m.host)
        where = self.checkpoint_container() if in_container else self.checkpoint_host()
        if where is not None:
            out["CHECKPOINT_DIR"] = str(where)
        return out

    def prepare(self, uid: int | None, *, job_uids: range | None = None) -> None:
        """Create the workspace, the volumes and the checkpoint directory on the host
        (`job_uids`: the node's job uids, whose workspaces may be handed over to `uid`)."""
        self.storage.prepare(self, uid, job_uids=job_uids)
        self.prepared = True


class Storage:
    """The node's job storage under the agent's workdir (and the shared root)."""

    def __init__(
        self,
        workdir: Path,
        *,
        shared_root: Path | None = None,
        project_gid_base: int = DEFAULT_PROJECT_GID_BASE,
        images: bool = True,
    ) -> None:
        self.workdir = workdir
        self.shared_root = shared_root
        self.project_gid_base = project_gid_base
        self.root = os.geteuid() == 0
        # node-local and scratch limits as loop-mounted images where the host allows
        why_not = loopfs.available() if images else "turned off"
        self.images = why_not is None
        if images and why_not is not None:
            log.info("volume limits are measured, not enforced by images: %s", why_not)

    # -- layout --------------------------------------------------------------------------------

    def ensure_layout(self) -> None:
        """The agent's directories: jobs/scratch/volumes passable (not listable) by job uids,
        run/ the agent's alone; an existing one of another mode is taken back."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        with hostfs.opened(hostfs.open_dir(self.workdir)) as top:
            if os.fstat(top).st_uid != os.geteuid():  # someone else could swap what is in it
                raise StorageError(f"the workdir {self.workdir} is not the agent's own")
            os.fchmod(top, (os.fstat(top).st_mode & 0o7777 & ~0o022) | 0o011)
            for name in ("jobs", "scratch", "volumes"):
                os.close(hostfs.own_dir(top, name, mode=0o711))
            for name in ("run", "images"):
                os.close(hostfs.own_dir(top, name, mode=0o700))

    def _open(self, below: str, base: Path | None = None) -> int:
        with hostfs.opened(hostfs.open_dir(base or self.workdir)) as top:
            return hostfs.open_beneath(top, below)

    def project_gid(self, project_id: int) -> int | None:
        """The supplementary gid of the project's jobs (None: the agent cannot switch ids)."""
        return self.project_gid_base + project_id if self.root and project_id > 0 else None

    # -- an attempt ----------------------------------------------------------------------------

    def plan(self, a: Any) -> Plan:
        """Check an assignment's storage and place it (StorageError saying what is wrong)."""
        raw_volumes: Sequence[object] = a.volumes or ()
        volumes = [Volume.from_wire(v) for v in raw_volumes]
        seen_names: set[str] = set()
        seen_paths: set[str] = set()
        for v in volumes:
            if v.name in seen_names:
                raise StorageError(f"volume {v.name} is named twice")
            if v.mount_path in seen_paths:
                raise StorageError(f"two volumes are mounted at {v.mount_path}")
            nested = [p for p in seen_paths if _under(v.mount_path, p) or _under(p, v.mount_path)]
            if nested:
                # the engine would create the inner mount point in the outer volume, which the
                # job writes: each volume gets a path of its own
                raise StorageError(f"volume {v.name}: {v.mount_path} is nested with {nested[0]}")
            seen_names.add(v.name)
            seen_paths.add(v.mount_path)
        project_id = a.project_id
        if volumes and (not isinstance(project_id, int) or project_id < 1):
            raise StorageError("the job mounts volumes but names no project")
        working_dir = container_path(a.working_dir or WORKSPACE, "working_dir")
        plan = Plan(
            storage=self,
            job_id=a.job_id,
            project_gid=self.project_gid(project_id) if volumes else None,
            working_dir=working_dir,
            mounts=tuple(self._place(a.job_id, v) for v in volumes),
        )
        if a.checkpoint:
            self._plan_checkpoint(plan, a.checkpoint)
        return plan

    def _place(self, job_id: int, v: Volume) -> Mount:
        if v.kind == "scratch":
            return Mount(v, self.workdir, f"scratch/{job_id}/{v.name}")
        if v.kind == "node_local":
            return Mount(v, self.workdir, f"volumes/v{v.id}")
        if self.shared_root is None:
            raise StorageError(
                f"volume {v.name} is on shared storage, which this node does not have "
                "(its agent has no AGENT_SHARED_ROOT)"
            )
        return Mount(v, self.shared_root, f"v{v.id}")

    @staticmethod
    def _plan_checkpoint(plan: Plan, raw: object) -> None:
        if not isinstance(raw, Mapping):
            raise StorageError(f"checkpoint must be an object, not {raw!r}")
        name = raw.get("volume")
        found = [m for m in plan.mounts if m.volume.name == name]
        if not found:
            raise StorageError(f"the checkpoint's volume {name!r} is not one of the job's volumes")
        if found[0].volume.read_only:
            raise StorageError(f"the checkpoint's volume {name} is mounted read-only")
        plan.checkpoint = found[0]
        plan.checkpoint_path = inside_path(raw.get("path"), "checkpoint path")

    def prepare(self, plan: Plan, uid: int | None, *, job_uids: range | None) -> None:
        gid = plan.project_gid
        try:
            self._workspace(plan.job_id, uid, job_uids)
            for m in plan.mounts:
                self._volume_dir(plan.job_id, m, uid, gid)
            if plan.checkpoint is not None:
                place = plan.checkpoint
                with (
                    hostfs.opened(self._open(place.below, place.base)) as fd,
                    hostfs.opened(self._make_path(fd, plan.checkpoint_path, uid, gid)) as ck,
                ):
                    hostfs.unlink(ck, STOP_FILE)  # a stop request is for the attempt it stopped
        except hostfs.UnsafePath as exc:
            raise StorageError(f"the job's storage cannot be set up: {exc.strerror}") from exc

    def _workspace(self, job_id: int, uid: int | None, job_uids: range | None) -> None:
        with hostfs.opened(self._open("jobs")) as jobs:
            fd, created = hostfs.make_dir(jobs, str(job_id), mode=0o700, uid=uid, gid=uid)
            with hostfs.opened(fd):
                owner = os.fstat(fd).st_uid
                if created or uid is None or owner == uid:
                    return
                # Only the agent creates entries in jobs/: this is the job's own workspace from
                # an earlier attempt, under the uid that attempt ran as.
                if job_uids is None or owner not in job_uids:
                    raise StorageError(f"the workspace of job {job_id} is not the job's")
                hostfs.reown_tree(fd, owner, uid)
                os.fchown(fd, uid, uid)

    def _volume_dir(self, job_id: int, m: Mount, uid: int | None, gid: int | None) -> None:
        # Per volume: root and the project's group (the owner: the job where ids do not switch).
        owner, group, mode = (0, gid, 0o2770) if gid is not None else (uid, uid, 0o700)
        if m.volume.kind == "scratch":
            with hostfs.opened(self._open("scratch")) as scratch:
                fd, _ = hostfs.make_dir(scratch, str(job_id), mode=0o711)
                with hostfs.opened(fd):
                    vol, _ = hostfs.make_dir(fd, m.volume.name, mode=mode, uid=owner, gid=group)
        else:
            parent, name = m.below.rsplit("/", 1) if "/" in m.below else ("", m.below)
            with hostfs.opened(self._open(parent, m.base)) as fd:
                vol, _ = hostfs.make_dir(fd, name, mode=mode, uid=owner, gid=group)
        with hostfs.opened(vol):
            empty = not os.listdir(vol)
        image = self._image(job_id, m)
        if image is not None and empty and not loopfs.mounted(m.host):
            # a new (or not yet mounted) volume: its limit enforced by the kernel
            loopfs.mount(image, m.host, m.volume.limit_mib, gid=gid)

    def _image(self, job_id: int, m: Mount) -> Path | None:
        """The image file of a volume whose limit an image enforces (None: measured)."""
        v = m.volume
        if not self.images or v.kind == "shared" or v.limit_mib < loopfs.MIN_MIB:
            return None
        name = f"v{v.id}.img" if v.kind == "node_local" else f"s{job_id}-{v.name}.img"
        return self.workdir / "images" / name

    @staticmethod
    def _make_path(fd: int, relative: str, uid: int | None, gid: int | None) -> int:
        """Open (creating what is missing, as the job's) `relative` below `fd`, link-free."""
        current = os.dup(fd)
        try:
            for part in [p for p in relative.split("/") if p]:
                nxt, _ = hostfs.make_dir(
                    current, part, mode=0o2770 if gid is not None else 0o700, uid=uid, gid=gid
                )
                os.close(current)
                current = nxt
        except BaseException:
            os.close(current)
            raise
        return current

    def write_stop_file(self, plan: Plan, data: bytes, *, uid: int = -1) -> None:
        """Write the checkpoint signal file into the job's checkpoint directory, link-free."""
        if plan.checkpoint is None:
            return
        gid = plan.project_gid if plan.project_gid is not None else -1
        with (
            hostfs.opened(self._open(plan.checkpoint.below, plan.checkpoint.base)) as fd,
            hostfs.opened(hostfs.open_beneath(fd, plan.checkpoint_path)) as ck,
        ):
            hostfs.write_file(ck, STOP_FILE, data, mode=0o664, uid=uid, gid=gid)

    # -- quotas --------------------------------------------------------------------------------

    def usage(self, m: Mount) -> int:
        """Bytes the volume takes now (its tree walked link-free)."""
        with hostfs.opened(self._open(m.below, m.base)) as fd:
            return hostfs.tree_usage(fd)

    @staticmethod
    def over_limit(m: Mount, used: int) -> bool:
        limit = m.volume.limit_mib * 1024 * 1024
        return limit > 0 and used > limit * _OVER_LIMIT

    # -- giving space back ---------------------------------------------------------------------

    def _remove(self, parent: str, name: str) -> bool:
        try:
            with hostfs.opened(self._open(parent)) as fd:
                return hostfs.remove_tree(fd, name)
        except OSError:
            return False

    def remove_workspace(self, job_id: int) -> bool:
        return self._remove("jobs", str(job_id))

    def _drop_images(self, prefix: str) -> None:
        with contextlib.suppress(OSError), hostfs.opened(self._open("images")) as images:
            for name in os.listdir(images):
                if name.startswith(prefix) and name.endswith(".img"):
                    hostfs.unlink(images, name)

    def remove_scratch(self, job_id: int) -> bool:
        top = self.workdir / "scratch" / str(int(job_id))
        with contextlib.suppress(OSError):
            for name in os.listdir(top):
                loopfs.unmount(top / name)
        removed = self._remove("scratch", str(int(job_id)))
        self._drop_images(f"s{int(job_id)}-")
        return removed

    def remove_volume(self, volume_id: int) -> bool:
        """A node-local volume the portal deleted."""
        loopfs.unmount(self.workdir / "volumes" / f"v{int(volume_id)}")
        removed = self._remove("volumes", f"v{int(volume_id)}")
        self._drop_images(f"v{int(volume_id)}.img")
        return removed

    def sweep(self, keep_jobs: set[int]) -> list[str]:
        """After a crash: remove workspaces and scratch no attempt here owns, and env files
        left in run/. What was removed (relative to the workdir)."""
        removed: list[str] = []
        for parent in ("jobs", "scratch"):
            with contextlib.suppress(OSError):
                for name in sorted(os.listdir(self.workdir / parent)):
                    if name.isdigit() and int(name) in keep_jobs:
                        continue
                    if parent == "scratch" and name.isdigit():
                        gone = self.remove_scratch(int(name))
                    else:
                        gone = self._remove(parent, name)
                    if gone:
                        removed.append(f"{parent}/{name}")
        with contextlib.suppress(OSError), hostfs.opened(self._open("run")) as run:
            for name in os.listdir(run):
                if name.endswith(".env"):
                    hostfs.unlink(run, name)
                    removed.append(f"run/{name}")
        return removed
