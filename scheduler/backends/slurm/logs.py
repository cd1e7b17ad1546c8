"""A Slurm job's log: its output file, on the filesystem the portal shares with the cluster.

The output directory is the pool's (the operator's); the file in it is the job's to write,
and the job may have swapped it for a symlink (to `/proc/self/environ`: the web process's
secrets), a FIFO (the reader would hang) or a device. So it is opened under a descriptor of
its directory with O_NOFOLLOW and O_NONBLOCK, and read only when fstat says it is a regular
file; anything else reads as empty.
"""

from __future__ import annotations

import os
import stat

from scheduler.backends.slurm.models import SlurmJob
from scheduler.models import Job

CHUNK = 64 * 1024


def log_text(job: Job, *, after: int = 0) -> tuple[str, int]:
    """Text of the output file from byte `after`, and the offset to ask from next time.
    Empty until Slurm has written the file (or when the filesystem is not shared)."""
    path = SlurmJob.objects.filter(job=job).values_list("output_path", flat=True).first()
    if not path:
        return "", after
    return read_output(path, after=after)


def read_output(path: str, *, after: int = 0) -> tuple[str, int]:
    """Up to CHUNK bytes of the regular file at `path` from byte `after` (cut at the last
    whole line), never through a symlink at its name: ("", after) for anything else."""
    directory, name = os.path.split(path)
    if not os.path.isabs(path) or not name or name in (".", ".."):
        return "", after
    try:
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return "", after
    try:
        fd = os.open(
            name,
            os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC,
            dir_fd=dir_fd,
        )
    except OSError:  # missing, or a symlink (ELOOP)
        return "", after
    finally:
        os.close(dir_fd)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return "", after
        data = os.pread(fd, CHUNK, after)
    finally:
        os.close(fd)
    # stop at the last whole line so that a UTF-8 character is never cut in two
    cut = data.rfind(b"\n") + 1 if len(data) == CHUNK else len(data)
    return data[:cut].decode("utf-8", errors="replace"), after + cut
