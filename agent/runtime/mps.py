"""Fractional GPUs on real hosts: limits set on the MPS control daemon.

Environment variables (`CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`)
are the job's to unset; the limits that hold are the ones the control daemon gives the MPS
server it starts for a client. `MpsControl.limit` sets them as that daemon's defaults through
`nvidia-cuda-mps-control`'s stdin (one command per line) before the job starts:

    set_default_active_thread_percentage <percent>
    set_default_device_pinned_mem_limit <device> <value>M

The daemon must run as the job's uid's MPS server owner (or root with multi-user MPS); setting
it up is the host's provisioning. Only unit-tested here: the test machine has no GPU.
"""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Sequence

from agent.runtime.base import LaunchError

log = logging.getLogger(__name__)


class MpsError(LaunchError):
    """The control daemon refused the limits (or is absent): the job does not start."""


class MpsControl:
    def __init__(
        self, *, control: str = "nvidia-cuda-mps-control", pipe_dir: str | None = None
    ) -> None:
        self.control = control
        self.pipe_dir = pipe_dir

    def commands(
        self, gpu_uuids: Sequence[str], share_milli: int, memory_limit_mib: int | None
    ) -> list[str]:
        percent = max(1, min(100, round(share_milli / 10)))
        lines = [f"set_default_active_thread_percentage {percent}"]
        if memory_limit_mib:
            lines += [
                f"set_default_device_pinned_mem_limit {uuid} {int(memory_limit_mib)}M"
                for uuid in gpu_uuids
            ]
        return lines

    def limit(
        self, gpu_uuids: Sequence[str], share_milli: int, memory_limit_mib: int | None
    ) -> None:
        """Send the limits to the control daemon; MpsError when it refuses or is absent."""
        env = dict(os.environ)
        if self.pipe_dir:
            env["CUDA_MPS_PIPE_DIRECTORY"] = self.pipe_dir
        for line in self.commands(gpu_uuids, share_milli, memory_limit_mib):
            try:
                done = subprocess.run(  # noqa: S603 - a fixed binary, our own command line
                    [self.control],
                    input=line + "\n",
                    capture_output=True,
                    text=True,
                    env=env,
                    timeout=10,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise MpsError(f"{self.control}: {exc}") from exc
            if done.returncode != 0 or "error" in (done.stdout + done.stderr).lower():
                raise MpsError(f"{self.control} refused {line!r}: {done.stderr or done.stdout}")
            log.info("MPS: %s", line)
