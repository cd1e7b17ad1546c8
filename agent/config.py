"""The agent's configuration: environment variables, overridden by command-line flags."""

from __future__ import annotations

import argparse
import os
import socket
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from agent.gpus import DEFAULT_SIM_GPUS, parse_sim_gpus
from agent.runtime.jobnet import parse_networks

TRUE_WORDS = frozenset({"1", "true", "yes", "on"})


def default_workdir() -> Path:
    """A stable place under the temp dir, so a restarted agent finds its state file again."""
    uid = os.getuid() if hasattr(os, "getuid") else 0
    return Path(tempfile.gettempdir()) / f"gpu-agent-{uid}"


@dataclass
class Config:
    """Everything the agent needs; `token` is never printed (not in repr either)."""

    portal_url: str
    token: str = field(repr=False)
    workdir: Path = field(default_factory=default_workdir)
    simulate: bool = False
    sim_gpus: str = DEFAULT_SIM_GPUS
    sim_seed: int | None = None
    hostname: str = field(default_factory=socket.gethostname)
    # where other nodes reach this node's jobs (a gang's MASTER_ADDR); "" : the hostname
    address: str = ""
    # None: use what the portal answers at registration (else the defaults below).
    heartbeat_interval_s: float | None = None
    poll_interval_s: float | None = None
    # The watch (agent/watch.py): told of each change of its assignments by the portal's events
    # service (at events_url; "": the portal URL, whose load balancer routes /events/ there),
    # the agent polls only every watch_poll_interval_s while the watch is live.
    watch: bool = True
    events_url: str = ""
    watch_poll_interval_s: float = 30.0
    request_timeout_s: float = 10.0
    request_attempts: int = 3  # quick tries per request inside the loop, then the loop backs off
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    unauthorized_backoff_s: float = 60.0
    default_grace_s: float = 30.0
    tick_s: float = 0.2
    log_flush_s: float = 1.0  # ship log output at least this often (and every 16 KiB)
    ca_bundle: str | None = None
    log_level: str = "INFO"
    # The workload runtime: "container" (Podman; the default) or "process" (demo/development).
    runtime: str = "container"
    engine: str = "podman"  # the command that runs Podman (e.g. "sudo -n /usr/bin/podman")
    default_image: str = ""  # for jobs that name no image
    job_uid_base: int = 200_000  # jobs run as uid base + job id mod 60000; 0: the agent's uid
    cpu_milli_per_gpu: int = 4000  # a job's CPU and memory when it asks for none
    memory_mib_per_gpu: int = 16384
    pids_limit: int = 4096
    # The job network fence gang members need (agent/runtime/jobnet.py): the command that runs
    # nft, and the networks other nodes' jobs have (CIDRs; none: only members on this host meet).
    nft: str = "nft"
    gang_networks: tuple[str, ...] = ()
    # Storage (agent/storage.py): where the operator mounts the pool's shared filesystem (""
    # : none here, jobs with shared volumes fail to start), the project gids' base, and how
    # often the volumes' usage is measured against their limits.
    shared_root: str = ""
    project_gid_base: int = 300_000
    quota_interval_s: float = 15.0
    volume_images: bool = True  # limits as loop-mounted images where the host allows

    DEFAULT_HEARTBEAT_INTERVAL_S = 10.0
    DEFAULT_POLL_INTERVAL_S = 2.0

    @classmethod
    def from_args(
        cls, argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
    ) -> Config:
        """Read the environment, then the flags (which win). Exits with usage on a bad value."""
        env = os.environ if environ is None else environ
        parser = build_parser(env)
        args = parser.parse_args(argv)
        token = env.get("NODE_TOKEN", "")
        if args.token_file:
            try:
                token = Path(args.token_file).read_text().strip()
                mode = Path(args.token_file).stat().st_mode & 0o777
            except OSError as exc:
                parser.error(f"cannot read the token file: {exc}")
            if mode & 0o077:
                parser.error(
                    f"the token file {args.token_file} is readable by others (mode "
                    f"{mode:04o}): it must be the agent user's alone (chmod 600)"
                )
        if not args.portal_url:
            parser.error("PORTAL_URL (or --portal-url) is required")
        if not token:
            parser.error("NODE_TOKEN (or NODE_TOKEN_FILE / --token-file) is required")
        try:
            parse_sim_gpus(args.sim_gpus)
            gang_networks = parse_networks(args.gang_networks.split(","))
        except ValueError as exc:
            parser.error(str(exc))
        return cls(
            portal_url=args.portal_url,
            token=token,
            # absolute: the engine and the jobs run elsewhere than the agent's own cwd
            workdir=Path(args.workdir).resolve() if args.workdir else default_workdir(),
            simulate=args.simulate,
            sim_gpus=args.sim_gpus,
            sim_seed=args.sim_seed,
            hostname=args.hostname or socket.gethostname(),
            address=args.address,
            heartbeat_interval_s=args.heartbeat_interval,
            poll_interval_s=args.poll_interval,
            watch=args.watch,
            events_url=args.events_url,
            watch_poll_interval_s=args.watch_poll_interval,
            request_timeout_s=args.request_timeout,
            default_grace_s=args.default_grace,
            ca_bundle=args.ca_bundle,
            log_level=args.log_level.upper(),
            runtime=args.runtime,
            engine=args.engine,
            default_image=args.default_image,
            job_uid_base=args.job_uid_base,
            cpu_milli_per_gpu=args.cpu_milli_per_gpu,
            memory_mib_per_gpu=args.memory_mib_per_gpu,
            pids_limit=args.pids_limit,
            nft=args.nft,
            gang_networks=gang_networks,
            shared_root=str(Path(args.shared_root).resolve()) if args.shared_root else "",
            project_gid_base=args.project_gid_base,
            quota_interval_s=args.quota_interval,
            volume_images=args.volume_images,
        )


def _float_or_none(value: str | None) -> float | None:
    return float(value) if value not in (None, "") else None


def build_parser(env: Mapping[str, str]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m agent",
        description="GPU cloud node agent: registers this host with the portal, reports GPU "
        "telemetry, runs the work the portal assigns.",
    )
    p.add_argument("--portal-url", default=env.get("PORTAL_URL", ""), help="env PORTAL_URL")
    p.add_argument(
        "--token-file",
        default=env.get("NODE_TOKEN_FILE", ""),
        help="read the node token from this file (env NODE_TOKEN_FILE); else env NODE_TOKEN. "
        "There is deliberately no --token flag: argv is visible to every user of the host.",
    )
    p.add_argument(
        "--workdir",
        default=env.get("AGENT_WORKDIR", ""),
        help="job working dirs, checkpoints and the agent's state file (env AGENT_WORKDIR; "
        f"default {default_workdir()})",
    )
    p.add_argument(
        "--simulate",
        action="store_true",
        default=env.get("AGENT_SIMULATE", "").strip().lower() in TRUE_WORDS,
        help="simulated GPUs even where NVML works (env AGENT_SIMULATE=1)",
    )
    p.add_argument(
        "--sim-gpus",
        default=env.get("AGENT_SIM_GPUS", DEFAULT_SIM_GPUS),
        help="simulated GPUs by catalog name, e.g. 4xH100-80GB-SXM or 2xL4,2xT4 "
        "(env AGENT_SIM_GPUS)",
    )
    p.add_argument(
        "--sim-seed",
        type=int,
        default=int(env["AGENT_SIM_SEED"]) if env.get("AGENT_SIM_SEED") else None,
        help="seed for simulated telemetry (env AGENT_SIM_SEED)",
    )
    p.add_argument("--hostname", default=env.get("AGENT_HOSTNAME", ""), help="env AGENT_HOSTNAME")
    p.add_argument(
        "--address",
        default=env.get("AGENT_ADDRESS", ""),
        help="address other nodes reach this node's jobs at, a gang's MASTER_ADDR "
        "(env AGENT_ADDRESS; default: the hostname)",
    )
    p.add_argument(
        "--heartbeat-interval",
        type=float,
        default=_float_or_none(env.get("AGENT_HEARTBEAT_INTERVAL")),
        help="seconds; default: what the portal says (env AGENT_HEARTBEAT_INTERVAL)",
    )
    p.add_argument(
        "--poll-interval",
        type=float,
        default=_float_or_none(env.get("AGENT_POLL_INTERVAL")),
        help="seconds between assignment polls; default: what the portal says "
        "(env AGENT_POLL_INTERVAL)",
    )
    p.add_argument(
        "--no-watch",
        dest="watch",
        action="store_false",
        default=env.get("AGENT_WATCH", "1").strip().lower() in TRUE_WORDS,
        help="do not watch the portal's events service for assignment changes; poll only "
        "(env AGENT_WATCH=0)",
    )
    p.add_argument(
        "--events-url",
        default=env.get("AGENT_EVENTS_URL", ""),
        help="the portal's events service, where the agent watches its assignments "
        "(env AGENT_EVENTS_URL; default: the portal URL, whose /events/ goes there)",
    )
    p.add_argument(
        "--watch-poll-interval",
        type=float,
        default=float(env.get("AGENT_WATCH_POLL_INTERVAL") or 30.0),
        help="seconds between fallback polls while the watch is live "
        "(env AGENT_WATCH_POLL_INTERVAL)",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=float(env.get("AGENT_REQUEST_TIMEOUT", "10")),
        help="seconds per HTTP request (env AGENT_REQUEST_TIMEOUT)",
    )
    p.add_argument(
        "--default-grace",
        type=float,
        default=float(env.get("AGENT_DEFAULT_GRACE", "30")),
        help="SIGTERM→SIGKILL grace when the portal gives none (env AGENT_DEFAULT_GRACE)",
    )
    p.add_argument(
        "--ca-bundle",
        default=env.get("AGENT_CA_BUNDLE") or None,
        help="CA bundle to verify the portal's TLS certificate (env AGENT_CA_BUNDLE)",
    )
    p.add_argument(
        "--log-level", default=env.get("AGENT_LOG_LEVEL", "INFO"), help="env AGENT_LOG_LEVEL"
    )
    p.add_argument(
        "--runtime",
        choices=("container", "process"),
        default=env.get("AGENT_RUNTIME", "container") or "container",
        help="run jobs in containers (Podman; the default) or, for demos and development "
        "only, as process groups (env AGENT_RUNTIME)",
    )
    p.add_argument(
        "--engine",
        default=env.get("AGENT_ENGINE", "podman") or "podman",
        help="the command that runs Podman, e.g. 'sudo -n /usr/bin/podman' (env AGENT_ENGINE)",
    )
    p.add_argument(
        "--default-image",
        default=env.get("AGENT_DEFAULT_IMAGE", ""),
        help="image for jobs that name none (env AGENT_DEFAULT_IMAGE)",
    )
    p.add_argument(
        "--job-uid-base",
        type=int,
        default=int(env.get("AGENT_JOB_UID_BASE") or 200_000),
        help="jobs run as uid BASE + job id mod 60000; 0 keeps the process runtime's jobs on "
        "the agent's uid (env AGENT_JOB_UID_BASE)",
    )
    p.add_argument(
        "--cpu-milli-per-gpu",
        type=int,
        default=int(env.get("AGENT_CPU_MILLI_PER_GPU") or 4000),
        help="a container's CPU limit per GPU when the job asks for none",
    )
    p.add_argument(
        "--memory-mib-per-gpu",
        type=int,
        default=int(env.get("AGENT_MEMORY_MIB_PER_GPU") or 16384),
        help="a container's memory limit per GPU when the job asks for none",
    )
    p.add_argument(
        "--pids-limit",
        type=int,
        default=int(env.get("AGENT_PIDS_LIMIT") or 4096),
        help="a container's process limit (env AGENT_PIDS_LIMIT)",
    )
    p.add_argument(
        "--nft",
        default=env.get("AGENT_NFT", "nft") or "nft",
        help="the command that runs nft for the gang network fence, e.g. "
        "'sudo -n /usr/sbin/nft' (env AGENT_NFT)",
    )
    p.add_argument(
        "--gang-networks",
        default=env.get("AGENT_GANG_NETWORKS", ""),
        help="comma-separated CIDRs of the addresses other nodes' gang members have; a gang "
        "member's container may reach them (env AGENT_GANG_NETWORKS; default none: only "
        "members on this host)",
    )
    p.add_argument(
        "--shared-root",
        default=env.get("AGENT_SHARED_ROOT", ""),
        help="where the pool's shared filesystem is mounted on this node (NFS, Lustre, "
        "CephFS); shared volumes and datasets live in it as v<id> (env AGENT_SHARED_ROOT)",
    )
    p.add_argument(
        "--project-gid-base",
        type=int,
        default=int(env.get("AGENT_PROJECT_GID_BASE") or 300_000),
        help="a project's jobs get the supplementary gid BASE + project id, the group of its "
        "volumes (env AGENT_PROJECT_GID_BASE)",
    )
    p.add_argument(
        "--quota-interval",
        type=float,
        default=float(env.get("AGENT_QUOTA_INTERVAL") or 15.0),
        help="seconds between measurements of the volumes' usage against their limits "
        "(env AGENT_QUOTA_INTERVAL)",
    )
    p.add_argument(
        "--no-volume-images",
        dest="volume_images",
        action="store_false",
        default=env.get("AGENT_VOLUME_IMAGES", "1").strip().lower() in TRUE_WORDS,
        help="measure node-local and scratch volumes' usage instead of giving each one a "
        "loop-mounted filesystem image of its size (env AGENT_VOLUME_IMAGES=0)",
    )
    return p
