"""The agent↔portal wire contract, defined once (standard library only).

Both sides import this module: the agent builds and reads these messages, the portal's agent
API (`scheduler/agent_api`) builds the assignments from `Assignment`, checks exit reasons
against `EXIT_REASONS`, and its serializers are held to these fields by a parity test
(`tests/scheduler/test_agent_protocol.py`). A field added here and not there (or the other way
round) fails that test.

Every message is a JSON object; the TypedDicts name its keys. `total=False` parts are optional.
"""

# No `from __future__ import annotations` here: TypedDict must see NotRequired[...] itself
# (string annotations make every key required on Python 3.11).
from typing import Literal, NotRequired, TypedDict

API_PREFIX = "/api/agent/v1"

# -- exits ----------------------------------------------------------------------------------------

# How an attempt ended, as the agent reports it.
EXIT_REASONS: tuple[str, ...] = (
    "exited",  # the job's main process ended by itself (exit_code says how)
    "killed",  # stopped by the agent: not assigned any more, agent shutdown, fence
    "preempted",  # stopped because the portal preempts it
    "cancelled",  # stopped because its owner cancelled it
    "failed_to_start",  # never ran: a missing image, a bad command, no such GPU
    "oom",  # the kernel's OOM killer ended it: it went over its memory limit
    "time_limit",  # it ran past its wall-clock time limit and was stopped
    "volume_full",  # a volume it writes to went past its size limit and it was stopped
)
ExitReason = Literal[
    "exited",
    "killed",
    "preempted",
    "cancelled",
    "failed_to_start",
    "oom",
    "time_limit",
    "volume_full",
]

# What the portal shows as a job's failure reason for the reasons that are not an exit code.
FAILURE_TEXT: dict[str, str] = {
    "oom": "out of memory",
    "time_limit": "time limit",
    "volume_full": "volume full",
}

LOG_STREAMS: tuple[str, ...] = ("stdout", "stderr")
# A gang's members share the job's attempt: member NODE_RANK numbers its log chunks from
# NODE_RANK × LOG_SEQ_PER_MEMBER, so the members' chunks never collide (512 members fit).
LOG_SEQ_PER_MEMBER = 4_000_000
ACTIONS: tuple[str, ...] = ("run", "stop")
# "resize": an elastic job stops to checkpoint and restart at a new size (reported as preempted)
STOP_REASONS: tuple[str, ...] = ("preempt", "cancel", "resize")
# The checkpoint signal file: just before the agent sends a job SIGTERM it writes
# `$CHECKPOINT_DIR/<STOP_FILE>` (JSON: reason, message, grace_seconds, deadline as epoch
# seconds and ISO 8601, job_id, attempt), for workloads that cannot catch signals (a shell
# script's children, a signal swallowed by a launcher) and poll it instead. `reason` is the
# portal's stop reason (`preempt`, `resize`, `cancel`) or the agent's own (`time_limit`,
# `volume_full`, and `killed`: no longer assigned, the node fenced or its agent shutting down).
# The agent removes it before an attempt starts, so a resumed attempt never sees its
# predecessor's; it writes it link-free (a symlink the job put there is replaced, not followed).
STOP_FILE = "stop-requested.json"


# -- agent → portal -------------------------------------------------------------------------------


class GpuInventory(TypedDict):
    index: int
    uuid: str
    name: str
    memory_mib: int
    mig_mode: NotRequired[bool]


class Register(TypedDict):
    """POST /register."""

    hostname: str
    address: NotRequired[str]  # where other nodes reach its jobs (a gang's MASTER_ADDR)
    simulated: NotRequired[bool]
    driver_version: NotRequired[str]
    cuda_version: NotRequired[str]
    cpu_milli: NotRequired[int]
    memory_mib: NotRequired[int]
    gpus: list[GpuInventory]
    # Whether it can run a member of a multi-node gang (the process runtime can; the container
    # runtime once its job network fence is in place), and why not. Missing (an agent from
    # before it said so): it can, as such agents were placed before, and an agent that cannot
    # still refuses the member at its start.
    gang_members: NotRequired[bool]
    gang_members_reason: NotRequired[str]


class RegisterAnswer(TypedDict):
    node: str
    heartbeat_interval_s: float
    poll_interval_s: float


class GpuProcess(TypedDict):
    pid: int
    used_memory_mib: NotRequired[int | None]


class Telemetry(TypedDict):
    uuid: str
    utilization: NotRequired[float | None]
    memory_used_mib: NotRequired[int | None]
    temperature_c: NotRequired[float | None]
    power_w: NotRequired[float | None]
    ecc_uncorrected: NotRequired[int | None]
    row_remap_pending: NotRequired[bool | None]
    xid_events: NotRequired[list[int]]
    throttle_reasons: NotRequired[list[str]]
    processes: NotRequired[list[GpuProcess]]
    lost: NotRequired[bool]
    age_s: NotRequired[float]


class Running(TypedDict):
    job_id: int
    attempt: int
    pid: NotRequired[int | None]


# What one heartbeat may carry. The agent samples its GPUs at 1 Hz and heartbeats every few
# seconds: 8 GPUs × 5 instants is 40 samples; 64 GPUs × 8 instants fit. After an outage the
# agent sends the newest instants that fit and drops the rest, so a heartbeat's cost to the
# portal is bounded (a stolen token cannot make one request cost a CPU-second).
MAX_HEARTBEAT_SAMPLES = 512
MAX_SAMPLE_PROCESSES = 64  # GPU processes listed per sample
MAX_HEARTBEAT_RUNNING = 1000  # attempts a heartbeat says run on the node


class Heartbeat(TypedDict):
    """POST /heartbeat: at most MAX_HEARTBEAT_SAMPLES samples, MAX_HEARTBEAT_RUNNING attempts."""

    telemetry: list[Telemetry]
    running: list[Running]


class HeartbeatAnswer(TypedDict):
    ok: bool
    fenced: bool
    images: NotRequired[list[str]]  # the curated images to keep pulled
    # node-local volumes the portal deleted: the agent removes their directories (idempotent)
    deleted_volumes: NotRequired[list[int]]


class Started(TypedDict):
    """POST /jobs/<id>/started (and a sync report of kind "started")."""

    attempt: int
    pid: NotRequired[int | None]
    image_digest: NotRequired[str]  # the image the container runtime ran (sha256:…)
    message: NotRequired[str]


class Exited(TypedDict):
    """POST /jobs/<id>/exited (and a sync report of kind "exited")."""

    attempt: int
    exit_code: int | None
    signal: NotRequired[int | None]
    reason: ExitReason
    message: NotRequired[str]


class Logs(TypedDict):
    """POST /jobs/<id>/logs."""

    attempt: int
    seq: int
    stream: Literal["stdout", "stderr"]
    text: str


class StateAnswer(TypedDict):
    """The answer to started/exited."""

    state: str


class LogsAnswer(TypedDict):
    stored: bool


class SyncReport(TypedDict):
    """One report in a sync: a Started or an Exited with its `kind` and `job_id`."""

    kind: Literal["started", "exited"]
    job_id: int
    attempt: int
    pid: NotRequired[int | None]
    image_digest: NotRequired[str]
    exit_code: NotRequired[int | None]
    signal: NotRequired[int | None]
    reason: NotRequired[ExitReason]
    message: NotRequired[str]


class Sync(TypedDict):
    """POST /sync."""

    version: NotRequired[str | None]
    reports: NotRequired[list[SyncReport]]
    assignments: NotRequired[bool]


# -- portal → agent -------------------------------------------------------------------------------


# A volume as an assignment carries it: ids, kinds, container paths and limits, never a host
# path (the agent derives those from its own configuration: agent/storage.py).
VOLUME_KINDS: tuple[str, ...] = ("scratch", "node_local", "shared")
DEFAULT_WORKING_DIR = "/workspace"  # the job's workspace in the container, its default cwd


class VolumeMount(TypedDict):
    id: int  # 0 for scratch (one per job and name)
    name: str
    kind: Literal["scratch", "node_local", "shared"]
    mount_path: str  # absolute, in the container
    read_only: bool
    limit_mib: int  # 0: no limit


class CheckpointPlace(TypedDict):
    volume: str  # the name of one of the assignment's volumes
    path: str  # relative, inside that volume


class Assignment(TypedDict):
    """One entry of the assignments (GET /assignments, POST /sync)."""

    job_id: int
    attempt: int
    action: Literal["run", "stop"]
    stop_reason: str | None
    command: str
    # what the job asked for plus what the platform sets: JOB_ID, RESUME, CHECKPOINT_DIR,
    # SHARD_INDEX/SHARD_COUNT, rendezvous; the agent adds CUDA_VISIBLE_DEVICES
    env: dict[str, str]
    gpu_uuids: list[str]
    share_milli: int
    gpu_memory_limit_mib: int | None
    # the working directory in the container (None or "": DEFAULT_WORKING_DIR)
    working_dir: str | None
    grace_seconds: float
    image: str  # "" : the node's default image
    time_limit_s: int | None  # wall clock, enforced by the agent
    cpu_milli: int  # 0: the default per GPU
    memory_mib: int  # 0: the default per GPU
    # /dev/shm in MiB (a Kubernetes emptyDir of medium Memory); 0: the engine's default.
    # It counts against the job's memory limit.
    shm_mib: int
    # The project: its jobs share a supplementary gid on the node (for its volumes' files).
    project_id: NotRequired[int]
    volumes: NotRequired[list[VolumeMount]]
    # where CHECKPOINT_DIR points: a path inside one of `volumes` (null: none)
    checkpoint: NotRequired[CheckpointPlace | None]


class SyncResult(TypedDict):
    kind: Literal["started", "exited"]
    job_id: int
    attempt: int
    state: NotRequired[str]
    conflict: NotRequired[str]


class SyncAnswer(TypedDict):
    unchanged: NotRequired[bool]
    version: NotRequired[str]
    fenced: NotRequired[bool]
    assignments: NotRequired[list[Assignment]]
    results: list[SyncResult]


class AssignmentsAnswer(TypedDict):
    fenced: bool
    assignments: list[Assignment]


# -- the job's environment ------------------------------------------------------------------------

# What the platform itself may set in a job's environment (besides what the job asked for).
PLATFORM_ENV: frozenset[str] = frozenset(
    {
        "JOB_ID",
        "RESUME",
        "CHECKPOINT_DIR",
        "SHARD_INDEX",
        "SHARD_COUNT",
        "CUDA_VISIBLE_DEVICES",
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "CUDA_MPS_PIPE_DIRECTORY",
        # the rendezvous torchrun and torch.distributed read (scheduler/gangs.py)
        "MASTER_ADDR",
        "MASTER_PORT",
        "WORLD_SIZE",
        "RANK",
        "NODE_RANK",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "NNODES",
    }
)
