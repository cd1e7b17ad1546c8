"""The path rules: what a tenant may name (container paths, file names) and how the portal
writes under the shared root without ever following a symlink.

No path a user gives is ever used as a host path. A volume's files live at
<STORAGE_SHARED_ROOT>/v<id>/ (the id is ours); a dataset's file name is sanitised to one path
component; every open below the root goes through directory file descriptors with
O_NOFOLLOW, so a symlink planted by a job that mounts the volume read-write is refused, never
followed.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from django.conf import settings

from portal.errors import Conflict, DomainError

# Container paths a volume may not be mounted at (the runtime's own, or the job's workspace).
RESERVED_CONTAINER_PATHS = ("/", "/proc", "/sys", "/dev", "/etc", "/bin", "/sbin", "/usr", "/lib")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
NOFOLLOW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def container_path_validate(path: str, *, field: str) -> str:
    """An absolute, normal path inside a container (`/data/x`), not one of the runtime's own.
    It names a place in the container only: the agent decides the host side."""
    if not path.startswith("/"):
        raise DomainError(f"{path!r} is not an absolute path in the container.", field=field)
    normal = posixpath.normpath(path)
    if normal != path.rstrip("/") or "\x00" in path or ".." in path.split("/"):
        raise DomainError(f"Write the path plainly, as {normal!r}.", field=field)
    for reserved in RESERVED_CONTAINER_PATHS:
        if normal == reserved or (reserved != "/" and normal.startswith(reserved + "/")):
            raise DomainError(
                f"{normal} is the container runtime's own; pick another.", field=field
            )
    return normal


def safe_file_name(name: str) -> str:
    """One path component made of letters, digits, '.', '_' and '-': the last component of what
    the user gave, anything else replaced by '_', never hidden, never '.' or '..'."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1].strip()
    clean = _UNSAFE.sub("_", base).lstrip(".")[:200]
    return clean or "data"


def shared_root() -> Path:
    return Path(settings.STORAGE_SHARED_ROOT)


def volume_dir_name(volume_id: int) -> str:
    return f"v{int(volume_id)}"


@contextmanager
def _dir_fd(path: Path) -> Iterator[int]:
    fd = os.open(path, NOFOLLOW_DIR)
    try:
        yield fd
    finally:
        os.close(fd)


@contextmanager
def volume_dir_fd(volume_id: int, *, create: bool) -> Iterator[int]:
    """A directory descriptor of the volume's own directory, made (0770) when `create`; a
    symlink in its place is refused (ELOOP/ENOTDIR become a DomainError)."""
    root = shared_root()
    if create:
        root.mkdir(parents=True, exist_ok=True)
    name = volume_dir_name(volume_id)
    with _dir_fd(root) as root_fd:
        if create:
            with suppress(FileExistsError):
                os.mkdir(name, 0o770, dir_fd=root_fd)
        try:
            fd = os.open(name, NOFOLLOW_DIR, dir_fd=root_fd)
        except OSError as exc:
            raise Conflict(
                f"The volume's directory cannot be opened safely ({exc.strerror}).",
                code="unsafe_path",
            ) from None
    try:
        yield fd
    finally:
        os.close(fd)


def open_file(dir_fd: int, name: str, flags: int, mode: int = 0o640) -> int:
    """Open `name` (one component) below `dir_fd` without following a symlink; only a regular
    file is accepted."""
    if name != safe_file_name(name):
        raise DomainError("Not a safe file name.", field="file_name")
    try:
        fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ELOOP, errno.EISDIR, errno.ENOTDIR, errno.EACCES):
            raise Conflict(
                f"{name} in the volume is not a regular file any more ({exc.strerror}); the "
                "portal does not follow links there. Start the upload again.",
                code="unsafe_path",
            ) from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DomainError(f"{name} is not a regular file.", field="file_name")
    return fd


def volume_files_remove(volume_id: int) -> None:
    """Remove the volume's directory and everything in it; symlinks inside are removed, never
    followed (`shutil.rmtree` works through directory descriptors on Linux)."""
    path = shared_root() / volume_dir_name(volume_id)
    if path.is_symlink():
        path.unlink()
        return
    if path.exists():
        assert shutil.rmtree.avoids_symlink_attacks, "this platform's rmtree follows symlinks"
        shutil.rmtree(path)
