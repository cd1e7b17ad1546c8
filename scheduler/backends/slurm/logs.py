"""A Slurm job's log: its output file, on the filesystem the portal shares with the cluster."""

from __future__ import annotations

from scheduler.backends.slurm.models import SlurmJob
from scheduler.models import Job

CHUNK = 64 * 1024


def log_text(job: Job, *, after: int = 0) -> tuple[str, int]:
    """Text of the output file from byte `after`, and the offset to ask from next time.
    Empty until Slurm has written the file (or when the filesystem is not shared)."""
    path = SlurmJob.objects.filter(job=job).values_list("output_path", flat=True).first()
    if not path:
        return "", after
    try:
        with open(path, "rb") as fh:
            fh.seek(after)
            data = fh.read(CHUNK)
    except OSError:
        return "", after
    # stop at the last whole line so that a UTF-8 character is never cut in two
    cut = data.rfind(b"\n") + 1 if len(data) == CHUNK else len(data)
    return data[:cut].decode("utf-8", errors="replace"), after + cut
