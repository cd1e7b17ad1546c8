"""Gangs and elastic resizes on the stack: gang start latency and resize latency.

    .venv/bin/python -m bench.gang_start [--runs 10] [--poll 1.0]

A fresh bench database, the production-like stack (`bench.stack`: gunicorn, a Celery worker and
beat, the cycle every second) and in-process simulated agents (the process runtime) polling
every `--poll` seconds: 32 one-GPU H100 nodes for the gangs and one 8-GPU A100 node for the
elastic job.

Gang start: a gang of 2, 8 and 32 members (one GPU each, `sleep 2`), `--runs` times each, one at
a time; from "all members placed" (the job's `scheduled` event, written by the cycle's apply
with every member's allocation) to "all members running" (its `running` event, written when
the last member's agent reports its start). Both instants are the database's, so the polling
here adds nothing.

Resize: an elastic job (2 to 8 GPUs) whose workload exits at once on SIGTERM (it has nothing to
checkpoint, so the workload's own checkpoint time is ~0 and not in the figure) is resized
8 -> 4 -> 8 ... by the user's request, `--runs` times; from the signal (the `preempting` event:
the assignment says stop) to running at the new size (the next `running` event), split into
signal -> stop confirmed (the agent's poll, SIGTERM, the exit report) and stop -> running (the
restart at the new size), for the shrinks (restarted at once on the GPUs kept) and the grows
(requeued at the new size, placed by the next cycle) apart. Then the planner's own grow into
idle GPUs, `--runs` times: the user shrinks the job to 4, and once it runs its minimum runtime
is lifted, so the next cycle grows it back to 8 into the GPUs it holds for it (restarted at
once, no cycle in between); from that grow's signal to running at 8.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from bench import command_line, markdown_table, write_section
from bench.django_env import setup, teardown
from bench.stack import Stack

GANG_SIZES = (2, 8, 32)


def seed() -> tuple[dict[str, str], dict[str, str]]:
    from portal.models import User
    from portal.services import project_create
    from scheduler.models import GpuModel, Pool, Quota
    from scheduler.nodes import node_issue_agent_token
    from scheduler.seed import catalog_seed, node_register_simulated

    catalog_seed()
    pool = Pool.objects.create(name="default")
    user = User.objects.create_user("bench@example.org", "x")
    project = project_create(owner=user, slug="bench", name="Bench")
    Quota.objects.filter(project=project).update(max_gpus=None, max_gpus_per_job=64)
    h100 = GpuModel.objects.get(name="H100-80GB-SXM")
    a100 = GpuModel.objects.get(name="A100-80GB")
    ones, eights = {}, {}
    for i in range(max(GANG_SIZES)):
        node = node_register_simulated(
            name=f"g{i:02d}", pool=pool, gpu_model=h100, gpu_count=1, cpu_milli=16_000,
            memory_mib=128_000,
        )  # fmt: skip
        ones[node.name] = node_issue_agent_token(node=node)
    node = node_register_simulated(
        name="e00", pool=pool, gpu_model=a100, gpu_count=8, cpu_milli=64_000, memory_mib=512_000
    )
    eights[node.name] = node_issue_agent_token(node=node)
    return ones, eights


def start_agents(stack: Stack, tokens: dict[str, str], gpus: str, poll_s: float) -> None:
    """`Stack.agents`, with jobs on the agent's own uid: job uids (base + job id) of a bench
    database would be the uids of other test runs' jobs on a shared host, whose end sweeps
    them (the process runtime kills what is left of a job's uid)."""
    import tempfile
    import threading
    from pathlib import Path

    from agent.config import Config
    from agent.main import Agent

    workroot = Path(tempfile.mkdtemp(prefix="bench-gang-agents-"))
    for name, token in tokens.items():
        config = Config(
            portal_url=stack.url,
            token=token,
            workdir=workroot / name,
            simulate=True,
            runtime="process",
            sim_gpus=gpus,
            hostname=name,
            address="127.0.0.1",
            poll_interval_s=poll_s,
            heartbeat_interval_s=5,
            job_uid_base=0,
            watch=False,  # polls only, as this benchmark's figures were recorded
        )
        threading.Thread(target=Agent(config).run, args=(stack.stop_agents,), daemon=True).start()


def wait_state(job_id: int, states: tuple[str, ...], timeout: float = 120) -> str:
    from scheduler.models import Job

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = Job.objects.filter(pk=job_id).values_list("state", flat=True).get()
        if state in states:
            return state
        time.sleep(0.1)
    raise SystemExit(f"job {job_id} did not reach {states} in {timeout}s")


def submit(**spec: object) -> int:
    from portal.models import Project, User
    from scheduler.admission import JobSpec, job_submit
    from scheduler.models import GpuModel

    model = GpuModel.objects.get(name=str(spec.pop("model")))
    (job,) = job_submit(
        actor=User.objects.get(email="bench@example.org"),
        project=Project.objects.get(slug="bench"),
        spec=JobSpec(gpu_model=model, **spec),  # type: ignore[arg-type]
    )
    from scheduler.cycle_requests import request_cycle

    request_cycle()
    return int(job.pk)


def event_at(job_id: int, to_state: str, attempt_after: float = 0.0) -> float:
    from scheduler.models import JobEvent

    times = [
        e.timestamp()
        for e in JobEvent.objects.filter(job_id=job_id, to_state=to_state)
        .order_by("created_at")
        .values_list("created_at", flat=True)
    ]
    return next(t for t in times if t > attempt_after)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def ms(v: float) -> str:
    return f"{v * 1000:.0f} ms"


def spread_ms(values: list[float]) -> list[str]:
    """p50, p95, min, max."""
    quantiles = (statistics.median(values), percentile(values, 0.95), min(values), max(values))
    return [ms(v) for v in quantiles]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--poll", type=float, default=1.0, help="agents' poll interval (s)")
    parser.add_argument("--port", type=int, default=8671)
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()

    db_url = setup("gangs")
    ones, eights = seed()
    teardown()
    stack = Stack(db_url, args.port, 2, "scheduler,default")
    gang: dict[int, list[float]] = {n: [] for n in GANG_SIZES}
    # (signal -> stop confirmed, stop -> running) by kind: 4 shrinks, 8 the user's grows,
    # 0 the planner's grows
    spans: dict[int, list[tuple[float, float]]] = {4: [], 8: [], 0: []}
    try:
        stack.start()
        start_agents(stack, ones, "1xH100-80GB-SXM", args.poll)
        start_agents(stack, eights, "8xA100-80GB", args.poll)
        time.sleep(8)  # every agent registered and polling
        for n in GANG_SIZES:
            for i in range(args.runs):
                job = submit(
                    name=f"gang{n}-{i}", command="sleep 2", model="H100-80GB-SXM", gpus=n,
                    nodes=n, gpus_per_node=1,
                )  # fmt: skip
                if wait_state(job, ("succeeded", "failed")) != "succeeded":
                    raise SystemExit(f"gang job {job} failed")
                gang[n].append(event_at(job, "running") - event_at(job, "scheduled"))
                print(f"gang of {n}: {ms(gang[n][-1])}", flush=True)

        from portal.models import User
        from scheduler.cycle_requests import request_cycle
        from scheduler.elastic import job_resize_request
        from scheduler.models import Job

        elastic = submit(
            name="elastic", model="A100-80GB", gpus=8, elastic_min=2, elastic_max=8,
            checkpoint_dir="/tmp/bench-elastic-ckpt",
            command="trap 'exit 143' TERM; sleep 3600 & wait",
        )  # fmt: skip
        wait_state(elastic, ("running",))
        user = User.objects.get(email="bench@example.org")

        def resized(before: float) -> tuple[float, float, float]:
            """(signal, stop confirmed, running) of the resize signalled after `before`."""
            signal_at = event_at(elastic, "preempting", before - 1)
            stopped_at = event_at(elastic, "queued", signal_at)
            return signal_at, stopped_at, event_at(elastic, "running", stopped_at)

        def running_on(gpus: int) -> None:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                job = Job.objects.get(pk=elastic)
                if job.state == "running" and job.gpus == gpus:
                    return
                time.sleep(0.1)
            raise SystemExit(f"the elastic job did not run on {gpus} GPUs in 120 s")

        for i in range(2 * args.runs):
            to = 4 if i % 2 == 0 else 8
            before = time.time()
            job_resize_request(actor=user, job=Job.objects.get(pk=elastic), gpus=to)
            running_on(to)
            signal_at, stopped_at, running_at = resized(before)
            spans[to].append((stopped_at - signal_at, running_at - stopped_at))
            print(f"resize to {to}: {ms(running_at - signal_at)}", flush=True)
        for _ in range(args.runs):  # the planner's grow into the idle GPUs held for it
            job_resize_request(actor=user, job=Job.objects.get(pk=elastic), gpus=4)
            running_on(4)
            before = time.time()
            Job.objects.filter(pk=elastic).update(min_runtime_s=0)  # it may grow now
            request_cycle()
            running_on(8)
            Job.objects.filter(pk=elastic).update(min_runtime_s=300)
            signal_at, stopped_at, running_at = resized(before)
            spans[0].append((stopped_at - signal_at, running_at - stopped_at))
            print(f"planner's grow to 8: {ms(running_at - signal_at)}", flush=True)
        Job.objects.filter(pk=elastic).update(elastic_max=None)
    finally:
        stack.stop()
    ended_load = os.getloadavg()

    rows = [[str(n), str(len(v)), *spread_ms(v)] for n, v in gang.items()]
    resize_rows = []
    for kind, label in (
        (4, "shrink 8 -> 4 (user; restarts on the GPUs it kept)"),
        (8, "grow 4 -> 8 (user; requeued, placed by the next cycle)"),
        (0, "grow 4 -> 8 (planner; restarts on the GPUs held for it)"),
    ):
        for part, values in (
            ("signal -> stop confirmed", [a for a, _ in spans[kind]]),
            ("stop -> running at the new size", [b for _, b in spans[kind]]),
            ("signal -> running at the new size", [a + b for a, b in spans[kind]]),
        ):
            resize_rows.append([label, part, str(len(values)), *spread_ms(values)])
    one, five, _ = ended_load
    body = "\n\n".join(
        [
            "## Gangs and elastic resizes: start and resize latency",
            f"`{command_line('bench.gang_start')}`",
            "The bench stack (gunicorn, Celery worker and beat, the cycle every second) with "
            f"in-process simulated agents polling every {args.poll:g} s (the process runtime), "
            "on the shared machine named below, other engineers' test suites running beside "
            f'it (load average at the end {one:.2f} / {five:.2f}, 1 / 5 min). From "all '
            'members placed" (the job\'s `scheduled` event) to "all members running" (its '
            "`running` event, when the last member's start is reported); database timestamps:",
            markdown_table(["members", "runs", "p50", "p95", "min", "max"], rows),
            "Resizes of an elastic job (A100s, 2 to 8) whose workload exits at once on SIGTERM, "
            "so its own checkpoint time (~0) is not in the figures:",
            markdown_table(["resize", "span", "runs", "p50", "p95", "min", "max"], resize_rows),
            "Anchor: the agents' poll interval. Each span is about one poll (the agent seeing "
            "its new assignment) plus the portal's and the agent's own work; a node's assignment "
            "version drops on every change, so the poll after it fetches the new assignment. "
            "A user's grow waits for a cycle after its stop; a shrink and the planner's grow "
            "restart in the same transaction as the stop's report.",
        ]
    )
    print(body)
    if not args.no_docs:
        write_section("gang_start", body)


if __name__ == "__main__":
    main()
