"""File operations of a root agent in directories a job can write: none follows a symlink.

A job owns what is inside its workspace and its volumes, and may have planted a symlink (or a
hard link, a FIFO) anywhere in them, and swapped a directory for a link between the agent's
look and its use. So every operation here starts from a directory file descriptor the agent
holds and takes one path component at a time with `O_NOFOLLOW` (`open_beneath`): a symlink in
the way is an error (ELOOP), never a detour. Ownership changes only on what the agent itself
created (`make_dir`), or, for the handover of a job's own workspace between its uids, on entries
of that job uid (`reown_tree`, by directory descriptors, `follow_symlinks=False`). Removal is
`shutil.rmtree` with `dir_fd`: on Linux it walks by descriptors and never follows a link
(`shutil.rmtree.avoids_symlink_attacks`). Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafePath(OSError):
    """A path the agent will not use: a symlink, or not a directory, where one was expected."""


def _component(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise UnsafePath(errno.EINVAL, f"not a plain path component: {name!r}")
    return name


def open_dir(path: str | os.PathLike[str]) -> int:
    """A descriptor of a directory the agent's own configuration names (it may be a link the
    operator made, such as a mount point's; only what lies below it is taken link-free)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)


def open_beneath(dir_fd: int, relative: str) -> int:
    """A descriptor of `relative` below `dir_fd`, taken one component at a time with
    O_NOFOLLOW: UnsafePath when any component is a symlink, not a directory, or missing."""
    fd = os.dup(dir_fd)
    try:
        for name in [p for p in relative.split("/") if p]:
            try:
                nxt = os.open(_component(name), DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                what = _what(exc, fd, name)
                raise UnsafePath(exc.errno, f"{relative}: {name!r} is {what}") from exc
            os.close(fd)
            fd = nxt
    except BaseException:
        os.close(fd)
        raise
    return fd


def _what(exc: OSError, dir_fd: int, name: str) -> str:
    """Why `name` could not be opened as a directory, in words."""
    with contextlib.suppress(OSError):
        if stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            return "a symlink"
    if exc.errno == errno.ELOOP:
        return "a symlink"
    if exc.errno == errno.ENOTDIR:
        return "not a directory"
    if exc.errno == errno.ENOENT:
        return "missing"
    return exc.strerror or "not usable"


@contextlib.contextmanager
def opened(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


def make_dir(
    dir_fd: int, name: str, *, mode: int, uid: int | None = None, gid: int | None = None
) -> tuple[int, bool]:
    """Create directory `name` below `dir_fd` (or open the one there): (its descriptor, whether
    it was created now). Owner and mode are set only on a directory created now: one that was
    there is opened as it is (UnsafePath when it is a symlink or not a directory)."""
    created = True
    try:
        os.mkdir(_component(name), 0o700, dir_fd=dir_fd)
    except FileExistsError:
        created = False
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        raise UnsafePath(exc.errno, f"{name!r} is {_what(exc, dir_fd, name)}") from exc
    if created:
        try:
            if uid is not None or gid is not None:
                os.fchown(fd, -1 if uid is None else uid, -1 if gid is None else gid)
            os.fchmod(fd, mode)  # after the chown, which may clear the setgid bit
        except BaseException:
            os.close(fd)
            raise
    return fd, created


def own_dir(dir_fd: int, name: str, *, mode: int) -> int:
    """An agent-only directory (`run/`): created, or taken back, as the agent's, with `mode`.
    Its parent is the agent's own, so what is there was made by the agent."""
    fd, _ = make_dir(dir_fd, name, mode=mode)
    os.fchown(fd, os.geteuid(), os.getegid())
    os.fchmod(fd, mode)
    return fd


def write_file(
    dir_fd: int, name: str, data: bytes, *, mode: int = 0o644, uid: int = -1, gid: int = -1
) -> None:
    """Write `name` below `dir_fd` whole (a new file, then a rename over the old name): a
    symlink or anything else at `name` is replaced, never written through."""
    tmp = f".{_component(name)}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp, dir_fd=dir_fd)
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        try:
            os.write(fd, data)
            if uid != -1 or gid != -1:
                os.fchown(fd, uid, gid)
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def unlink(dir_fd: int, name: str) -> None:
    """Remove the entry `name` itself (a symlink there is removed, not its target)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(_component(name), dir_fd=dir_fd)


def remove_tree(dir_fd: int, name: str) -> bool:
    """Remove `name` below `dir_fd` and everything in it, following no symlink (a symlink at
    `name` itself is removed as a link). False when nothing was there."""
    try:
        st = os.stat(_component(name), dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return True
    assert shutil.rmtree.avoids_symlink_attacks  # Linux: the descriptor-based walk
    shutil.rmtree(name, dir_fd=dir_fd)
    return True


MAX_DEPTH = 256  # deeper than this the walks below do not go (a job can nest without end)


def walk(dir_fd: int, *, depth: int = 0) -> Iterator[tuple[int, os.DirEntry[str]]]:
    """(its directory's descriptor, entry) for everything below `dir_fd`, depth first. Only
    directories are opened, with O_DIRECTORY|O_NOFOLLOW: never a link, a FIFO or a device,
    whatever a job swaps in meanwhile."""
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            yield dir_fd, entry
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if not is_dir or depth >= MAX_DEPTH:
                continue
            try:
                fd = os.open(entry.name, DIR_FLAGS, dir_fd=dir_fd)
            except OSError:
                continue  # gone, or swapped for a link
            with opened(fd):
                yield from walk(fd, depth=depth + 1)


def tree_usage(dir_fd: int) -> int:
    """Bytes of disk the tree below `dir_fd` takes (blocks allocated; each inode once),
    following no symlink."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for _fd, entry in walk(dir_fd):
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        key = (st.st_dev, st.st_ino)
        if key not in seen:
            seen.add(key)
            total += st.st_blocks * 512
    return total


def reown_tree(dir_fd: int, old: int, new: int) -> None:
    """Hand what uid `old` owns below `dir_fd` to uid `new` (a job's workspace when the job
    runs under another uid than its earlier attempt): only entries of `old`, never a file with
    other hard links (it may be someone else's too), never through a symlink."""
    for fd, entry in walk(dir_fd):
        with contextlib.suppress(OSError):
            st = os.stat(entry.name, dir_fd=fd, follow_symlinks=False)
            if st.st_uid != old or (stat.S_ISREG(st.st_mode) and st.st_nlink > 1):
                continue
            gid = new if st.st_gid == old else -1
            os.chown(entry.name, new, gid, dir_fd=fd, follow_symlinks=False)
