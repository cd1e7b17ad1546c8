"""Workload runtimes: how the agent turns an assignment into a running, fenced job.

`ContainerRuntime` (the default) runs each attempt in an OCI container through Podman: its own
uid, pid and network namespaces, one cgroup with the job's CPU, memory and pids limits, GPUs by
CDI. `ProcessRuntime` (demo and development, chosen with `AGENT_RUNTIME=process`) runs it as a
process group under a uid of its own when the agent may switch uids.

Both get the job's environment already scrubbed by the runner (an allow-list: what the job asked
for plus what the platform sets) and return a `Launch`: the argv the runner starts and watches.
"""

from __future__ import annotations

from agent.runtime.base import Launch, LaunchError, Outcome, Runtime, job_uid
from agent.runtime.container import ContainerRuntime, engine_available
from agent.runtime.process import ProcessRuntime

__all__ = [
    "ContainerRuntime",
    "Launch",
    "LaunchError",
    "Outcome",
    "ProcessRuntime",
    "Runtime",
    "engine_available",
    "job_uid",
]
