"""Volume size limits the kernel enforces: one ext4 image per volume, loop-mounted.

Where the agent is root and the host has loop devices, `mkfs.ext4` and `mount`, a node-local or
scratch volume with a limit is a sparse file of that size (`<workdir>/images/`, the agent's
alone), formatted and mounted (`nosuid,nodev`) at the volume's directory: a write past the
limit fails with ENOSPC instead of being noticed later. Elsewhere (or for a volume whose
directory already holds files) the agent measures usage instead (agent/storage.py).
The image's size is the limit; ext4's own metadata takes a few percent of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

log = logging.getLogger(__name__)

MIN_MIB = 16  # smaller limits are measured: ext4 wants room for its own metadata
_TOOLS = ("mkfs.ext4", "mount", "umount")
_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


def available() -> str | None:
    """Why images cannot be used here, or None when they can."""
    if os.geteuid() != 0:
        return "the agent is not root"
    if not os.path.exists("/dev/loop-control"):
        return "no loop devices"
    missing = [t for t in _TOOLS if shutil.which(t, path=_PATH) is None]
    if missing:
        return f"missing {', '.join(missing)}"
    return None


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: S603 - fixed tools, the agent's own paths
        [shutil.which(argv[0], path=_PATH) or argv[0], *argv[1:]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        stdin=subprocess.DEVNULL,
        env={"PATH": _PATH, "LANG": "C"},
    )


def mounted(path: Path) -> bool:
    return os.path.ismount(path)


def mount(image: Path, mountpoint: Path, size_mib: int, *, gid: int | None) -> bool:
    """Mount the volume's image at `mountpoint` (made now, root:gid, when it is new); False
    when that cannot be done (the caller measures instead)."""
    fresh = not image.exists()
    try:
        if fresh:
            fd = os.open(image, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            try:
                os.ftruncate(fd, size_mib * 1024 * 1024)
            finally:
                os.close(fd)
            owner = f"0:{gid if gid is not None else 0}"
            done = _run("mkfs.ext4", "-q", "-F", "-m", "0", "-E", f"root_owner={owner}", str(image))
            if done.returncode != 0:
                raise OSError(f"mkfs.ext4: {done.stderr.strip()[-200:]}")
        done = _run("mount", "-o", "loop,nosuid,nodev", str(image), str(mountpoint))
        if done.returncode != 0:
            raise OSError(f"mount: {done.stderr.strip()[-200:]}")
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("volume image %s not used (%s): its usage is measured instead", image, exc)
        if fresh:
            with contextlib.suppress(OSError):
                image.unlink()
        return False
    if fresh:
        fd = os.open(mountpoint, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        try:
            os.fchmod(fd, 0o2770 if gid is not None else 0o700)
            with contextlib.suppress(OSError):
                os.rmdir("lost+found", dir_fd=fd)
        finally:
            os.close(fd)
    return True


def unmount(mountpoint: Path) -> bool:
    """Unmount a volume (lazily when a process still holds it); False when it was not."""
    if not mounted(mountpoint):
        return False
    if _run("umount", str(mountpoint)).returncode != 0:
        _run("umount", "-l", str(mountpoint))
    return not mounted(mountpoint)
