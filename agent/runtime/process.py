"""The process runtime (demo and development): the job as a process group of its own uid.

Chosen only explicitly (`AGENT_RUNTIME=process`). What fences the job here:

- its environment is the runner's allow-list (nothing of the agent's);
- when the agent runs as root, the job runs as a uid of its own (`JobUids`), with no
  supplementary group but its project's (for its volumes) and umask 077 (007 with volumes): it
  cannot read the agent's token file or state file (0600, the agent's), `/proc/<agent>/environ`
  or memory, another job's workspace (0700, that job's uid), another project's volumes
  (root:project gid 2770), nor signal the agent (another uid);
- its volumes are at their host paths (`VOLUME_<NAME>`, `CHECKPOINT_DIR`): there is no mount
  namespace, so read-only is not enforced and the job starts in its workspace whatever its
  `working_dir` (docs/storage.md);
- every process of that uid is killed when the attempt ends, so a `setsid` child that left the
  process group does not outlive the job.

A command is run as `<shell> -c <command>`, except a plain simple command (`sleep 3600`,
`python3 -m agent.workload --steps 5`: words of only safe characters, a program found on the
job's PATH that is no shell builtin or keyword), which is exec'd directly with the same
environment (plus the `PWD` the shell would have exported): Debian's dash forks such a command
instead of exec'ing it, so there the shell only costs a process start (0.7-0.9 ms of CPU per
job) and sits as the job's main process. See `direct_argv`.

Without the privilege to switch uids (an unprivileged agent) the job runs as the agent's own
uid: it keeps the scrubbed environment and its process group, but it can read what the agent
can read and signal it. The agent says so in its log at start; use the container runtime there.
The process runtime sets no memory, CPU or network limits: that is the container runtime's job.
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from agent.runtime.base import (
    Assignment,
    JobUids,
    Launch,
    Runtime,
    job_uid_range,
    kill_uid,
)
from agent.runtime.mps import MpsControl

if TYPE_CHECKING:
    from agent.storage import Plan

log = logging.getLogger(__name__)

# What a word of a command that the shell would take literally may hold: no quoting, expansion,
# globbing, tilde, comment, operator, redirection or grouping character.
_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_./,:+%@=- \t")
# First words the shell runs itself, never by exec: dash's builtins and reserved words, plus
# bash's (where /bin/sh is bash), so a command that names one keeps its shell meaning even where
# a program of that name exists (`echo`, `test`, `kill`, `time`...).
_SHELL_WORDS = (
    ". : [ alias bg break cd chdir command continue echo eval exec exit export false fc fg "
    "getopts hash jobs kill local printf pwd read readonly return set shift test times trap "
    "true type ulimit umask unalias unset wait "
    "! case do done elif else esac fi for if in then until while { } [[ ]] "
    "builtin caller compgen complete compopt coproc declare dirs disown enable function help "
    "history let logout mapfile popd pushd readarray select shopt source suspend time typeset"
)
SHELL_WORDS = frozenset(_SHELL_WORDS.split())
# What exec(2) runs: an ELF binary or a script with an interpreter line. Anything else the shell
# would run as a shell script (its ENOEXEC fallback), so it keeps the shell.
_EXEC_MAGIC = (b"\x7fELF", b"#!")


def direct_argv(command: str, env: Mapping[str, str], cwd: Path) -> list[str] | None:
    """The argv to exec instead of `sh -c command`, where the shell would add nothing; None
    where it keeps the shell.

    That is a plain simple command: words of only `_PLAIN` characters (so the shell's word
    splitting is `str.split()` and nothing is expanded), whose first word is not a shell
    builtin or keyword (`SHELL_WORDS`) nor an assignment (`FOO=1 cmd`), and names an
    executable (an ELF binary or a `#!` script) found as the shell would find it: on the job's
    PATH (relative entries under the job's cwd), or the path itself when it has a slash. A
    program that is not found keeps the shell, so it fails as before: exit 127 and the shell's
    message in the job's log, not a failed start. A job that sets its own PWD keeps the shell,
    which decides whether to keep or replace it.
    """
    if not _PLAIN.issuperset(command):
        return None
    words = command.split()
    if not words or words[0] in SHELL_WORDS or "=" in words[0] or "PWD" in env:
        return None
    program = words[0]
    path: str | None
    if "/" in program:
        path = os.path.join(cwd, program)  # an absolute program stays as it is
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            return None
    else:
        search = env.get("PATH")
        if search is None:
            return None  # the shell's own default PATH would apply
        dirs = [d if os.path.isabs(d) else os.path.join(cwd, d) for d in search.split(os.pathsep)]
        path = shutil.which(program, path=os.pathsep.join(dirs))
        if path is None:
            return None
    # Read as the agent: only a regular file, and never waiting on one (a FIFO a job left on
    # its PATH must not hang the agent, a device must not be opened at all).
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return None
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError:
        return None
    try:
        head = os.read(fd, 4)
    except OSError:
        return None
    finally:
        os.close(fd)
    if not head.startswith(_EXEC_MAGIC):
        return None
    return words


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

    def launch(self, a: Assignment, *, plan: Plan, env: dict[str, str]) -> Launch:
        uid = self.uids.acquire(a.job_id) if self.uids is not None else None
        try:
            plan.prepare(uid, job_uids=job_uid_range(self.uid_base))
        except BaseException:
            if self.uids is not None:
                self.uids.release(uid)
            raise
        cwd = plan.workspace
        # No mount namespace: the job reaches its volumes at their host paths (VOLUME_<NAME>,
        # CHECKPOINT_DIR), always in its workspace, and read-only is not enforced here.
        env = {**env, **plan.env(in_container=False)}
        gid = plan.project_gid if uid is not None else None
        if self.mps is not None and a.gpu_uuids and a.share_milli < 1000:
            self.mps.limit(a.gpu_uuids, a.share_milli, a.gpu_memory_limit_mib)
        if uid is not None:
            env = {**env, "HOME": str(cwd)}
        argv = direct_argv(a.command, env, cwd)
        if argv is None:
            argv = [self.shell, "-c", a.command]
        else:
            # The shell exports PWD (its physical cwd) to what it runs; the program gets the same.
            env = {**env, "PWD": os.path.realpath(cwd)}
        return Launch(
            argv=argv,
            env=env,
            cwd=cwd,
            user=uid,
            group=uid,
            groups=(gid,) if gid is not None else (),
            owner=uid,
        )

    def cleanup(self, launch: Launch) -> None:
        if self.uids is not None:
            self.uids.release(launch.user)
        if launch.user is not None:
            gang = launch.env.get("NNODES", "1") != "1"
            killed = kill_uid(launch.user, node_rank=launch.env.get("NODE_RANK") if gang else None)
            if killed:
                log.warning("killed %d leftover process(es) of uid %d", killed, launch.user)
