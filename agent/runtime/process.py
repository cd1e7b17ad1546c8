"""The process runtime (demo and development): the job as a process group of its own uid.

Chosen only explicitly (`AGENT_RUNTIME=process`). What fences the job here:

- its environment is the runner's allow-list (nothing of the agent's);
- when the agent runs as root, the job runs as a uid of its own (`JobUids`), with no
  supplementary groups and umask 077: it cannot read the agent's token file or state file
  (0600, the agent's), `/proc/<agent>/environ` or memory, another job's directories (0700, that
  job's uid), nor signal the agent (another uid);
- every process of that uid is killed when the attempt ends, so a `setsid` child that left the
  process group does not outlive the job.

Without the privilege to switch uids (an unprivileged agent) the job runs as the agent's own
uid: it keeps the scrubbed environment and its process group, but it can read what the agent
can read and signal it. The agent says so in its log at start; use the container runtime there.
The process runtime sets no memory, CPU or network limits: that is the container runtime's job.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from agent.runtime.base import Assignment, JobUids, Launch, Runtime, kill_uid, prepare_dir
from agent.runtime.mps import MpsControl

log = logging.getLogger(__name__)


class ProcessRuntime(Runtime):
    name = "process"

    def __init__(
        self,
        *,
        uid_base: int | None = None,
        shell: str = "/bin/sh",
        mps: MpsControl | None = None,
    ) -> None:
        # Switch uids only when asked to and allowed to.
        self.uid_base = uid_base if uid_base and os.geteuid() == 0 else None
        if uid_base and self.uid_base is None:
            log.warning(
                "the process runtime cannot run jobs as other uids (the agent is not root): "
                "jobs run as the agent's own uid and can read what it reads"
            )
        self.shell = shell
        self.mps = mps
        self.uids = JobUids(self.uid_base) if self.uid_base is not None else None

    def describe(self) -> str:
        if self.uid_base is None:
            return "process (jobs run as the agent's uid)"
        return f"process (jobs run as uid {self.uid_base}+)"

    def launch(
        self, a: Assignment, *, cwd: Path, checkpoint: Path | None, env: dict[str, str]
    ) -> Launch:
        uid = self.uids.acquire(a.job_id) if self.uids is not None else None
        try:
            prepare_dir(cwd, uid, uid_base=self.uid_base)
            if checkpoint is not None:
                prepare_dir(checkpoint, uid, uid_base=self.uid_base)
        except BaseException:
            if self.uids is not None:
                self.uids.release(uid)
            raise
        if self.mps is not None and a.gpu_uuids and a.share_milli < 1000:
            self.mps.limit(a.gpu_uuids, a.share_milli, a.gpu_memory_limit_mib)
        if uid is not None:
            env = {**env, "HOME": str(cwd)}
        return Launch(argv=[self.shell, "-c", a.command], env=env, cwd=cwd, user=uid, group=uid)

    def cleanup(self, launch: Launch) -> None:
        if self.uids is not None:
            self.uids.release(launch.user)
        if launch.user is not None:
            gang = launch.env.get("NNODES", "1") != "1"
            killed = kill_uid(launch.user, node_rank=launch.env.get("NODE_RANK") if gang else None)
            if killed:
                log.warning("killed %d leftover process(es) of uid %d", killed, launch.user)
