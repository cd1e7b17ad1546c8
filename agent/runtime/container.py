"""The container runtime: each attempt in an OCI container through Podman.

One attempt is one container (`gpucloud-job-<job>-<attempt>`, and `-<node rank>` for a gang's
member), and so one cgroup and one pid namespace: `podman kill` reaches every process in it,
and when the job's main process ends the kernel ends everything else in the namespace (a
`setsid` child cannot escape). What it gets:

- the job's image, never pulled at start (`--pull=never`: warm nodes keep the curated images);
  a missing image fails the attempt at once, naming it; the digest it ran is reported;
- its own uid (`--user`, see `JobUids`), no capabilities, `no-new-privileges`;
- CPU, memory (no swap on top) and pids limits from the job, else defaults per GPU. On a
  cgroup v1 host (with root) the memory limit is set on a parent cgroup the agent creates per
  attempt (`--cgroup-parent=gpucloud/<name>`): the container's own cgroup is gone by the time its
  exit is seen, and Podman 4.3 does not notice a v1 OOM kill (`OOMKilled` stays false), so the
  parent's peak usage at the limit together with a SIGKILL is what says "out of memory";
  elsewhere `--memory` and Podman's `OOMKilled`;
- the shared memory the job asks for (`shm_mib`, Kubernetes' emptyDir of medium Memory) as
  `--shm-size`; it counts against the memory limit;
- explicit `--ulimit` values within the agent's own hard limits (Podman's defaults can exceed
  them and then the container does not start);
- `--network none`: no interface but its own loopback, so the management plane on the host's
  loopback (Redis, PostgreSQL, the agent API) and the rest of the network are out of reach;
  a single node's processes (torchrun's workers) meet on that loopback. A gang's member
  (`NNODES` > 1) must reach the other members instead: it shares the node's network
  (`--network=host`) behind the job network fence (`agent/runtime/jobnet.py`: its TCP
  connections on this host complete only to sockets of its own uid, which its gang shares),
  checked before each member starts; without the fence a member does not start;
- GPUs through NVIDIA's CDI (`--device nvidia.com/gpu=<uuid>`) on a real host; none on a
  simulated one;
- its own workspace at /workspace (`<workdir>/jobs/<job>`, owned by its uid) and its cwd at
  the assignment's `working_dir` (a path in the container); each of its volumes bind-mounted
  at its container path, read-only where asked (agent/storage.py places them: no host path
  comes from the portal); its project's gid as a supplementary group and umask 0007, so the
  project's jobs share the files in its volumes; CHECKPOINT_DIR inside a volume; the
  agent's source, read-only, for the demo workload;
- its environment in an env file in `<workdir>/run/` (0700, the agent's), removed as soon as
  the container exists (`settle`), not only at the end.

Podman runs as root (`--runtime runc`): rootless Podman on a cgroup v1 host (such as the test VM)
cannot apply cgroup limits at all, and crun refuses the hybrid layout. Where the agent runs as
its own user, `AGENT_ENGINE` names a command that runs Podman as root for it (for example a sudo
rule for exactly `/usr/bin/podman`); see deploy/gpu-agent.service.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from agent import hostfs
from agent.protocol import DEFAULT_WORKING_DIR as WORKSPACE
from agent.runtime.base import (
    Assignment,
    JobUids,
    Launch,
    LaunchError,
    Outcome,
    Runtime,
    job_uid_range,
)
from agent.runtime.jobnet import JobNetwork
from agent.runtime.mps import MpsControl

if TYPE_CHECKING:
    from agent.storage import Plan

log = logging.getLogger(__name__)

NAME_PREFIX = "gpucloud-job-"
LABEL = "org.gpucloud.agent"
AGENT_SOURCE = "/opt/gpucloud"
EXIT_OOM = 137  # 128 + SIGKILL: how a container whose process the OOM killer ended exits
CGROUP_ROOT = Path("/sys/fs/cgroup")
CGROUP_PARENT = "gpucloud"


def engine_available(engine: str = "podman") -> bool:
    """Podman answers here (the agent's choice between the runtimes, and `make run`'s)."""
    argv = shlex.split(engine)
    if not argv or shutil.which(argv[-1] if argv[0] == "sudo" else argv[0]) is None:
        return False
    try:
        done = subprocess.run(  # noqa: S603 - the configured engine
            [*argv, "version", "--format", "{{.Client.Version}}"],
            capture_output=True,
            timeout=20,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def engine_env() -> dict[str, str]:
    """Podman's own environment: the agent's basics, nothing of the job's or its secrets."""
    keep = ("PATH", "LANG", "HOME", "TMPDIR", "XDG_RUNTIME_DIR", "CONTAINERS_CONF")
    env = {k: os.environ[k] for k in keep if k in os.environ}
    env.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return env


def _ulimit(name: str, which: int, want: int) -> str:
    _soft, hard = resource.getrlimit(which)
    value = want if hard == resource.RLIM_INFINITY else min(want, hard)
    return f"{name}={value}:{value}"


class ContainerRuntime(Runtime):
    name = "container"

    def __init__(
        self,
        *,
        engine: str = "podman",
        oci_runtime: str = "runc",
        default_image: str = "",
        uid_base: int | None = None,
        cpu_milli_per_gpu: int = 4000,
        memory_mib_per_gpu: int = 16384,
        pids_limit: int = 4096,
        gpu_devices: bool = False,
        agent_source: str | None = None,
        node_label: str = "",
        mps: MpsControl | None = None,
        network: JobNetwork | None = None,
    ) -> None:
        self.engine = shlex.split(engine)
        self.oci_runtime = oci_runtime
        self.default_image = default_image
        self.uid_base = uid_base if uid_base is not None else 200_000
        self.uids = JobUids(self.uid_base)
        self.cpu_milli_per_gpu = cpu_milli_per_gpu
        self.memory_mib_per_gpu = memory_mib_per_gpu
        self.pids_limit = pids_limit
        self.gpu_devices = gpu_devices
        self.agent_source = agent_source
        self.node_label = node_label or "agent"
        self.mps = mps
        self.network = network  # the fence gang members need (None: gangs cannot run here)
        self.state_dir: Path | None = None  # the runner sets it: where env files are written
        self.cgroup_root = CGROUP_ROOT
        self._pulled: set[str] = set()  # curated images known to be on the node
        self._puller: threading.Thread | None = None
        self.ulimits = [
            _ulimit("nofile", resource.RLIMIT_NOFILE, 65536),
            _ulimit("nproc", resource.RLIMIT_NPROC, pids_limit),  # per uid: one job
        ]

    def describe(self) -> str:
        return f"container ({' '.join(self.engine)} --runtime {self.oci_runtime})"

    # -- memory cgroup (v1) --------------------------------------------------------------------

    def _memory_parent(self, name: str) -> Path:
        return self.cgroup_root / "memory" / CGROUP_PARENT / name

    def _limit_parent(self, name: str, memory_mib: int) -> bool:
        """Create the attempt's parent memory cgroup with its limit (cgroup v1, root)."""
        if (self.cgroup_root / "cgroup.controllers").exists():
            return False  # cgroup v2: --memory, and Podman sees the OOM kill there
        path = self._memory_parent(name)
        try:
            path.mkdir(parents=True, exist_ok=True)
            limit = str(memory_mib * 1024 * 1024)
            (path / "memory.limit_in_bytes").write_text(limit)
            swap = path / "memory.memsw.limit_in_bytes"
            if swap.exists():
                swap.write_text(limit)
        except OSError as exc:
            log.debug("no parent memory cgroup for %s (%s): --memory instead", name, exc)
            self._remove_parent(name)
            return False
        return True

    def _remove_parent(self, name: str) -> None:
        for controller in self.cgroup_root.glob(f"*/{CGROUP_PARENT}/{name}"):
            for sub in sorted(controller.glob("**/"), key=lambda p: -len(p.parts)):
                with contextlib.suppress(OSError):
                    sub.rmdir()

    # -- podman --------------------------------------------------------------------------------

    def _podman(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        return subprocess.run(  # noqa: S603 - the configured engine, our own arguments
            [*self.engine, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            stdin=subprocess.DEVNULL,
        )

    def image_digest(self, image: str) -> str:
        """The digest of a local image (its id where it has no registry digest); LaunchError
        naming it when the node does not have it."""
        try:
            done = self._podman("image", "inspect", "--format", "{{.Digest}} {{.Id}}", image)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise LaunchError(f"the container engine did not answer: {exc}") from exc
        if done.returncode != 0:
            raise LaunchError(
                f"image {image!r} not found on this node (images are not pulled at start)"
            )
        digest, _, image_id = done.stdout.strip().partition(" ")
        if digest.startswith("sha256:") and digest != "sha256:":
            return digest
        return f"sha256:{image_id}" if image_id and ":" not in image_id else image_id

    # -- warm images ---------------------------------------------------------------------------

    def keep_pulled(self, images: list[str]) -> None:
        """Pull the curated images this node lacks, in the background and one at a time, so
        that a job's start is never a cold pull (jobs run with --pull=never)."""
        wanted = [image for image in images if image not in self._pulled]
        if not wanted or (self._puller is not None and self._puller.is_alive()):
            return
        self._puller = threading.Thread(
            target=self.pull_missing, args=(wanted,), name="image-puller", daemon=True
        )
        self._puller.start()

    def pull_missing(self, images: list[str]) -> list[str]:
        """Pull each image the node does not have; the images it has afterwards."""
        for image in images:
            try:
                if self._podman("image", "exists", image).returncode != 0:
                    log.info("pulling curated image %s", image)
                    done = self._podman("pull", "--quiet", image, timeout=3600)
                    if done.returncode != 0:
                        log.warning("could not pull %s: %s", image, done.stderr.strip()[-300:])
                        continue
                self._pulled.add(image)
            except (OSError, subprocess.TimeoutExpired) as exc:
                log.warning("could not pull %s: %s", image, exc)
        return sorted(self._pulled & set(images))

    @staticmethod
    def container_name(job_id: int, attempt: int, member: str = "") -> str:
        """`gpucloud-job-<job>-<attempt>`, and `-<node rank>` for a gang's member: simulated
        nodes on one host share one Podman, and each member needs a container of its own."""
        name = f"{NAME_PREFIX}{job_id}-{attempt}"
        return f"{name}-{member}" if member else name

    # -- the network ---------------------------------------------------------------------------

    def gang_members(self) -> str | None:
        if self.network is None:
            return "the agent runs without a job network fence"
        reason = self.network.ensure()
        return None if reason is None else f"its job network fence is not in place: {reason}"

    def network_flag(self, env: dict[str, str]) -> str:
        """`--network=none` unless the job is a gang's member, which gets the node's network
        once the fence is in place (LaunchError saying why not otherwise)."""
        try:
            nodes = int(env.get("NNODES") or 1)
        except ValueError:
            nodes = 1
        if nodes <= 1:
            return "--network=none"
        if self.network is None:
            raise LaunchError(
                "a gang member cannot run in a container on this node: it has no job network "
                "fence (the agent runs without one)"
            )
        reason = self.network.ensure()
        if reason is not None:
            raise LaunchError(
                "a gang member cannot run in a container on this node: its network fence is "
                f"not in place ({reason})"
            )
        return "--network=host"

    # -- the interface -------------------------------------------------------------------------

    def limits(self, a: Assignment) -> tuple[int, int]:
        """(cpu_milli, memory_mib): the job's, else the defaults per GPU (one for no GPU)."""
        units = max(1, len(a.gpu_uuids))
        cpu = a.cpu_milli or self.cpu_milli_per_gpu * units
        memory = a.memory_mib or self.memory_mib_per_gpu * units
        return cpu, memory

    def launch(self, a: Assignment, *, plan: Plan, env: dict[str, str]) -> Launch:
        image = a.image or self.default_image
        if not image:
            raise LaunchError("the job names no image and this node has no default image")
        network = self.network_flag(env)
        digest = self.image_digest(image)
        uid = self.uids.acquire(a.job_id)
        try:
            return self._launch(a, uid, image, network, digest, plan, env)
        except BaseException:
            self.uids.release(uid)
            raise

    def _launch(
        self,
        a: Assignment,
        uid: int,
        image: str,
        network: str,
        digest: str,
        plan: Plan,
        env: dict[str, str],
    ) -> Launch:
        plan.prepare(uid, job_uids=job_uid_range(self.uid_base))
        cwd = plan.workspace
        member = env.get("NODE_RANK", "") if network == "--network=host" else ""
        name = self.container_name(a.job_id, a.attempt, member if member.isdigit() else "")
        self._podman("rm", "--force", "--time", "0", name)  # a leftover of the same attempt
        cpu_milli, memory_mib = self.limits(a)
        env = {**env, **plan.env(in_container=True), "HOME": WORKSPACE}
        argv = [
            *self.engine,
            "--runtime",
            self.oci_runtime,
            "run",
            "--name",
            name,
            "--label",
            f"{LABEL}={self.node_label}",
            "--pull=never",
            "--init",
            network,
            f"--user={uid}:{uid}",
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            f"--cpus={cpu_milli / 1000:g}",
            f"--pids-limit={self.pids_limit}",
            *(f"--ulimit={u}" for u in self.ulimits),
            "--volume",
            f"{cwd}:{WORKSPACE}:rw",
            "--workdir",
            plan.working_dir,
        ]
        for m in plan.mounts:
            argv += [
                "--volume",
                f"{m.host}:{m.volume.mount_path}:{'ro' if m.volume.read_only else 'rw'}",
            ]
        if plan.project_gid is not None:
            argv += [f"--group-add={plan.project_gid}", "--umask=0007"]
        if self._limit_parent(name, memory_mib):
            argv += [f"--cgroup-parent=/{CGROUP_PARENT}/{name}"]
            limit = "parent"
        else:
            argv += [f"--memory={memory_mib}m", f"--memory-swap={memory_mib}m"]
            limit = "container"
        if a.shm_mib > 0:  # shared memory the job asked for (PyTorch DataLoader workers...)
            argv += [f"--shm-size={a.shm_mib}m"]
        if self.agent_source:
            argv += ["--volume", f"{self.agent_source}/agent:{AGENT_SOURCE}/agent:ro"]
            env["PYTHONPATH"] = AGENT_SOURCE
        if self.gpu_devices:
            argv += [f"--device=nvidia.com/gpu={u}" for u in a.gpu_uuids]
            if self.mps is not None and a.gpu_uuids and a.share_milli < 1000:
                self.mps.limit(a.gpu_uuids, a.share_milli, a.gpu_memory_limit_mib)
        # The job's environment goes in a file only the agent reads (argv is visible in ps),
        # never into Podman's own environment (LD_PRELOAD there would run as root).
        env_file = self._env_file(name, env)
        argv += ["--env-file", str(env_file)]
        argv += [f"--env={k}={v}" for k, v in sorted(env.items()) if "\n" in v or "\r" in v]
        argv += [image, "/bin/sh", "-c", a.command]
        return Launch(
            argv=argv,
            env=engine_env(),
            cwd=cwd,
            image=image,
            image_digest=digest,
            container=name,
            memory_mib=memory_mib,
            owner=uid,
            extra={"env_file": str(env_file), "memory_limit": limit, "uid": str(uid)},
        )

    def _env_file(self, name: str, env: dict[str, str]) -> Path:
        """The job's env file, in a directory only the agent reaches (0700, the agent's)."""
        directory = self.state_dir or Path(tempfile.gettempdir()) / "gpucloud-agent-run"
        directory.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"{k}={v}\n" for k, v in sorted(env.items()) if "\n" not in v and "\r" not in v]
        with (
            hostfs.opened(hostfs.open_dir(directory.parent)) as parent,
            hostfs.opened(hostfs.own_dir(parent, directory.name, mode=0o700)) as run,
        ):
            hostfs.write_file(run, f"{name}.env", "".join(lines).encode(), mode=0o600)
        return directory / f"{name}.env"

    def settle(self, launch: Launch) -> bool:
        """The env file goes as soon as the container exists (Podman has read it by then)."""
        path = launch.extra.get("env_file")
        if not path:
            return True
        try:
            done = self._podman("container", "exists", launch.container)
        except (OSError, subprocess.TimeoutExpired):
            return False
        if done.returncode != 0:
            return False
        with contextlib.suppress(OSError):
            os.unlink(path)
        del launch.extra["env_file"]
        return True

    def signal(self, launch: Launch, pgid: int, sig: int) -> bool:
        try:
            done = self._podman("kill", "--signal", str(int(sig)), launch.container)
        except (OSError, subprocess.TimeoutExpired):
            done = None
        alive = done is not None and done.returncode == 0
        if alive and sig != signal.SIGKILL:
            return True  # podman run ends with the container and reports its status
        if done is not None and sig != signal.SIGKILL and self._has_ended(launch.container):
            # It ended while the signal was on its way (a workload that saw the checkpoint
            # signal file and exited): podman run reports its status; signalling podman run
            # now would lose it.
            return False
        # Before the container exists the signal goes to podman run, which then does not
        # create it; a SIGKILL goes to both (podman run cannot forward that one).
        return super().signal(launch, pgid, sig) or alive

    def _has_ended(self, container: str) -> bool:
        try:
            done = self._podman("container", "inspect", "--format", "{{.State.Status}}", container)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0 and done.stdout.strip() in ("exited", "stopped")

    def outcome(self, launch: Launch, returncode: int | None) -> Outcome | None:
        oom = Outcome(
            "oom", f"out of memory: the job went over its memory limit of {launch.memory_mib} MiB"
        )
        if launch.extra.get("memory_limit") == "parent":
            if returncode not in (EXIT_OOM, -9):
                return None
            parent = self._memory_parent(launch.container)
            for name in ("memory.memsw.max_usage_in_bytes", "memory.max_usage_in_bytes"):
                try:
                    peak = int((parent / name).read_text())
                except (OSError, ValueError):
                    continue
                if peak >= launch.memory_mib * 1024 * 1024:
                    return oom
            return None
        try:
            done = self._podman(
                "inspect", "--format", "{{.State.OOMKilled}} {{.State.ExitCode}}", launch.container
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        killed, _, _code = done.stdout.strip().partition(" ")
        if done.returncode == 0 and killed == "true":
            return oom
        return None

    def cleanup(self, launch: Launch) -> None:
        self.uids.release(int(launch.extra["uid"]) if "uid" in launch.extra else None)
        with contextlib.suppress(OSError, KeyError):
            os.unlink(launch.extra["env_file"])
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            done = self._podman("rm", "--force", "--time", "0", launch.container)
            if done.returncode != 0 and "no such container" not in done.stderr.lower():
                log.warning("podman rm %s: %s", launch.container, done.stderr.strip())
        self._remove_parent(launch.container)

    def leftovers(self) -> list[tuple[int, int]]:
        try:
            done = self._podman(
                "ps",
                "--all",
                "--filter",
                f"label={LABEL}={self.node_label}",
                "--format",
                "{{.Names}}",
            )
        except (OSError, subprocess.TimeoutExpired):
            return []
        found: list[tuple[int, int]] = []
        for name in done.stdout.split():
            if not name.startswith(NAME_PREFIX):
                continue
            try:
                job_id, attempt = (int(x) for x in name[len(NAME_PREFIX) :].split("-")[:2])
            except ValueError:
                continue
            log.warning("removing container %s left behind by a previous agent", name)
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                self._podman("rm", "--force", "--time", "10", name, timeout=60)
            self._remove_parent(name)
            found.append((job_id, attempt))
        return found
