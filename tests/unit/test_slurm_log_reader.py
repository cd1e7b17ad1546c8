"""The Slurm log reader reads a job's output file, and nothing a job links or plants there."""

from __future__ import annotations

import os
from pathlib import Path

from scheduler.backends.slurm.logs import CHUNK, read_output


def test_it_reads_the_output_file_from_an_offset(tmp_path: Path) -> None:
    out = tmp_path / "portal-job-7.out"
    out.write_bytes(b"step 1\nstep 2\n")
    assert read_output(str(out)) == ("step 1\nstep 2\n", 14)
    assert read_output(str(out), after=7) == ("step 2\n", 14)
    assert read_output(str(tmp_path / "absent.out"), after=3) == ("", 3)


def test_a_full_chunk_stops_at_the_last_whole_line(tmp_path: Path) -> None:
    out = tmp_path / "big.out"
    out.write_bytes(b"x" * (CHUNK - 3) + b"\n\xc3\xa9tail")
    text, offset = read_output(str(out))
    assert offset == CHUNK - 2 and text.endswith("x\n")


def test_a_symlink_to_the_portals_environment_reads_as_nothing(tmp_path: Path) -> None:
    """The finding: a job linked its output file to /proc/self/environ and got the web
    process's secrets in its log."""
    out = tmp_path / "portal-job-8.out"
    out.symlink_to("/proc/self/environ")
    assert b"PATH=" in out.read_bytes()  # what following the link would have shown
    assert read_output(str(out)) == ("", 0)
    # a symlink to an ordinary file the portal can read: nothing either
    secret = tmp_path / "settings.env"
    secret.write_text("DJANGO_SECRET_KEY=x\n")
    other = tmp_path / "portal-job-9.out"
    other.symlink_to(secret)
    assert read_output(str(other)) == ("", 0)


def test_a_fifo_or_a_directory_is_not_read_and_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "portal-job-10.out"
    os.mkfifo(fifo)  # opening it for reading would wait for a writer without O_NONBLOCK
    assert read_output(str(fifo)) == ("", 0)
    folder = tmp_path / "portal-job-11.out"
    folder.mkdir()
    assert read_output(str(folder)) == ("", 0)
    assert read_output("relative/path.out") == ("", 0)
