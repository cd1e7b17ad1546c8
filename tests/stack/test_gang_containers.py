"""Gangs in containers on the running stack: live portal, real Celery worker, two node agents as
real processes on one host (two simulated nodes that reach each other at 127.0.0.1), each
running its member through Podman and runc with the job image `scripts/test-containers.sh`
builds. The members share the node's network behind the job network fence
(`agent/runtime/jobnet.py`): they meet at the rendezvous and on the further ports they pick,
and reach nothing else of the host — not Redis, PostgreSQL, the agent API, a service on the
host's loopback, nor another tenant's gang listening on the same network."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from rest_framework.test import APIClient

from agent.runtime import ContainerRuntime
from portal.services import token_create
from scheduler.models import Job, JobMember, JobState, LogChunk, Node
from tests.polling import wait_for
from tests.stack_fixtures import wait_for_registration

IMAGE = os.environ.get("RUNTIME_TEST_IMAGE", "")
pytestmark = [
    pytest.mark.celery,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not IMAGE,
        reason=os.environ.get("RUNTIME_TEST_SKIP")
        or "no job image: run through scripts/test.sh (it builds one with mmdebstrap)",
    ),
    pytest.mark.skipif(os.geteuid() != 0, reason="root Podman and nftables need root"),
    pytest.mark.skipif(
        shutil.which("nft") is None,
        reason="nft is missing: the gang network fence is an nftables table (scripts/test.sh "
        "installs Debian's nftables when root)",
    ),
]


@pytest.fixture
def stack(celery_live_worker, agents, team, fleet, settings):
    settings.AGENT_PORTAL_URL = agents.url
    Node.objects.filter(name="l1").update(state=Node.State.CORDONED)
    token_file = agents.workdir / "h1.token"
    token_file.write_text(fleet["tokens"]["h1"])
    token_file.chmod(0o600)
    for name in ("h1", "h2"):
        agents.start(
            name,
            fleet["tokens"][name],
            "2xH100-80GB-SXM",
            AGENT_ADDRESS="127.0.0.1",
            AGENT_RUNTIME="container",
            AGENT_DEFAULT_IMAGE=IMAGE,
            AGENT_JOB_UID_BASE="200000",
        )
    wait_for_registration(["h1", "h2"])
    clients = {}
    for who in ("member", "outsider"):
        client = APIClient()
        secret = token_create(user=team[who], name="gang-containers").secret
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
        clients[who] = client
    return {"api": clients, "agents": agents, "token_file": token_file, **team, **fleet}


def submit(stack, who: str = "member", **fields) -> int:
    project = "alpha" if who == "member" else "beta"
    body = {"project": project, "name": "gang", "gpu_model": "H100-80GB-SXM", **fields}
    resp = stack["api"][who].post(f"{stack['agents'].url}/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return int(resp.json()["id"])


def state_of(job_id: int) -> str:
    return Job.objects.get(pk=job_id).state


def log_of(job_id: int) -> str:
    return "".join(LogChunk.objects.filter(job_id=job_id).values_list("text", flat=True))


def connectable(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except OSError:
        return False
    return True


def quoted(script: str) -> str:
    return "'" + script.replace("'", "'\"'\"'") + "'"


# Both members: rank 0 listens at MASTER_ADDR:MASTER_PORT; rank 1 connects there with its rank
# and a port it listens on (picked by the kernel, as gloo's and NCCL's pairs are); rank 0
# connects back to that port with the sum. Then each tries what the fence must refuse.
GANG = textwrap.dedent(
    r"""
    import json, os, socket, sys, time
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0:
        srv = socket.create_server(("", port))
        srv.settimeout(60)
        conn, _ = srv.accept()
        peer_rank, peer_port = map(int, conn.recv(64).decode().split())
        total = rank + 1 + peer_rank + 1
        back = socket.create_connection((addr, peer_port), timeout=10)
        back.sendall(str(total).encode())
        back.close()
    else:
        mine = socket.create_server(("", 0))
        mine.settimeout(60)
        deadline = time.time() + 60
        while True:
            try:
                conn = socket.create_connection((addr, port), timeout=5)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.3)
        conn.sendall(f"{rank} {mine.getsockname()[1]}".encode())
        back, _ = mine.accept()
        total = int(back.recv(64).decode())
    print(f"rank {rank} of {world} node {os.environ['NODE_RANK']}: sum {total}", flush=True)

    got = {}
    def attempt(name, fn):
        try:
            got[name] = "GOT " + repr(fn())[:200]
        except Exception as exc:
            got[name] = "blocked: " + type(exc).__name__
    def connect(port):
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
        s.close()
        return port
    targets = json.loads(sys.argv[1])
    for name, target in targets["tcp"].items():
        attempt(name, lambda: connect(target))
    def udp():
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.sendto(b"from-the-gang", ("127.0.0.1", targets["udp"]))
        return "sent"
    attempt("udp to the host", udp)
    attempt("token file", lambda: open(targets["token_file"]).read())
    print(f"ATTACK {rank} " + json.dumps(got), flush=True)
    """
)

VICTIM = textwrap.dedent(
    """
    import os, socket, time
    if os.environ["RANK"] == "0":
        srv = socket.create_server(("", int(os.environ["MASTER_PORT"])))
        srv.settimeout(1)
        while True:
            try:
                conn, _ = srv.accept()
                conn.sendall(b"victim-secret")
                conn.close()
            except OSError:
                pass
    time.sleep(300)
    """
)


def test_a_gang_meets_in_containers_across_two_agents_and_reaches_nothing_else(stack):
    # Another tenant's gang, listening on the node's network at its rendezvous port.
    victim = submit(
        stack,
        "outsider",
        name="victim",
        gpus=2,
        nodes=2,
        gpus_per_node=1,
        command=f"python3 -c {quoted(VICTIM)}",
    )
    wait_for(lambda: state_of(victim) == JobState.RUNNING, timeout=90)
    victim_port = Job.objects.get(pk=victim).rendezvous_port
    assert victim_port
    wait_for(lambda: connectable(victim_port), timeout=30)  # open: the host itself reaches it

    # A service on the host's loopback, as any daemon of the node's would be (TCP and UDP).
    service = socket.create_server(("127.0.0.1", 0))
    service.settimeout(0.2)
    accepted: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = service.accept()
            except OSError:
                continue
            accepted.append("tcp")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    datagrams = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    datagrams.bind(("127.0.0.1", 0))
    datagrams.settimeout(0.2)

    portal_port = int(stack["agents"].url.rsplit(":", 1)[1])
    targets = {
        "tcp": {
            "redis": 6379,
            "postgresql": 5432,
            "agent api": portal_port,
            "host loopback service": service.getsockname()[1],
            "another tenant's gang": victim_port,
        },
        "udp": datagrams.getsockname()[1],
        "token_file": str(stack["token_file"]),
    }
    try:
        job_id = submit(
            stack,
            gpus=2,
            nodes=2,
            gpus_per_node=1,
            command=f"python3 -c {quoted(GANG)} {quoted(json.dumps(targets))}",
        )
        wait_for(lambda: state_of(job_id) in (JobState.SUCCEEDED, JobState.FAILED), timeout=150)
        text = log_of(job_id)
        failure = Job.objects.get(pk=job_id).failure_reason
        assert state_of(job_id) == JobState.SUCCEEDED, (failure, text)
        wait_for(lambda: log_of(job_id).count("ATTACK ") == 2, timeout=20)
        text = log_of(job_id)
        # 1 + 2 on both ranks: they met at the rendezvous and on the port rank 1 picked
        assert "rank 0 of 2 node 0: sum 3" in text and "rank 1 of 2 node 1: sum 3" in text, text
        for line in text.splitlines():
            if line.startswith("ATTACK "):
                got = json.loads(line.split(" ", 2)[2])
                for name, outcome in got.items():
                    assert outcome.startswith("blocked"), (line[:9], name, outcome)
        with pytest.raises(OSError):
            datagrams.recvfrom(64)  # the datagram never arrived
        assert accepted == []  # nor did any connection complete to the host's service
    finally:
        stop.set()
        thread.join(5)
        service.close()
        datagrams.close()
    members = JobMember.objects.filter(job_id=job_id).order_by("rank")
    assert [m.state for m in members] == ["succeeded", "succeeded"]
    assert members[0].node_id != members[1].node_id
    # the victim ran on, untouched; a single-node job still has no network at all
    assert state_of(victim) == JobState.RUNNING
    alone = submit(stack, name="alone", gpus=1, command="cat /proc/net/dev")
    wait_for(lambda: state_of(alone) in (JobState.SUCCEEDED, JobState.FAILED), timeout=90)
    wait_for(lambda: "lo:" in log_of(alone), timeout=20)
    interfaces = [ln.split(":")[0].strip() for ln in log_of(alone).splitlines() if ":" in ln]
    assert interfaces == ["lo"], log_of(alone)


ALL_REDUCE = textwrap.dedent(
    """
    import os, torch, torch.distributed as dist
    dist.init_process_group("gloo", init_method="env://")
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    print(f"rank {rank} of {world} node {os.environ['NODE_RANK']}: all_reduce {t.item():g}")
    dist.destroy_process_group()
    """
)


def test_torch_distributed_all_reduce_in_containers_across_two_agents(stack, tmp_path: Path):
    """A real torch.distributed job (gloo on CPU) in containers, one member on each of two
    agents: 1 + 2 = 3 on both ranks. The job image has no PyTorch: the job brings it in its
    working directory, as a researcher's own environment would (a hard-linked copy of the
    test environment's site-packages; same Python minor version as the image's)."""
    torch = pytest.importorskip(
        "torch", reason="PyTorch (CPU) is not installed: scripts/test.sh installs torch==2.13.0"
    )
    image_python = subprocess.run(
        [
            "podman",
            "run",
            "--rm",
            "--network=none",
            *(f"--ulimit={u}" for u in ContainerRuntime().ulimits),  # within our limits
            IMAGE,
            "python3",
            "-c",
            "import sys; print('%d.%d' % sys.version_info[:2])",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    ).stdout.strip()
    if image_python != f"{sys.version_info[0]}.{sys.version_info[1]}":
        pytest.skip(
            f"the job image's Python ({image_python}) is not this venv's: its torch "
            "cannot be loaded there"
        )
    from storage.models import Volume

    # the job's environment on a shared volume of its project, mounted read-only on both
    # members (the portal writes a volume's files at <shared root>/v<id>, as for a dataset)
    env_volume = Volume.objects.create(project=stack["a"], name="env", kind="shared", size_gib=5)
    site = Path(torch.__file__).resolve().parents[1]
    work = stack["agents"].shared_root / f"v{env_volume.pk}"
    work.mkdir(mode=0o755)
    subprocess.run(["cp", "-al", str(site), str(work / "site")], check=True)
    (work / "all_reduce.py").write_text(ALL_REDUCE)
    job_id = submit(
        stack,
        gpus=2,
        nodes=2,
        gpus_per_node=1,
        volumes=[{"name": "env", "path": "/env", "read_only": True}],
        working_dir="/env",
        command="PYTHONPATH=/env/site python3 /env/all_reduce.py",
        env={"GLOO_SOCKET_IFNAME": "lo"},
    )
    wait_for(lambda: state_of(job_id) in (JobState.SUCCEEDED, JobState.FAILED), timeout=180)
    assert state_of(job_id) == JobState.SUCCEEDED, log_of(job_id)
    lines = ("rank 0 of 2 node 0: all_reduce 3", "rank 1 of 2 node 1: all_reduce 3")
    wait_for(lambda: all(line in log_of(job_id) for line in lines), timeout=20)
    job = Job.objects.get(pk=job_id)
    assert job.image_digest.startswith("sha256:")  # it ran in the job image
