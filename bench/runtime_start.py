"""Workload runtime: start latency and CPU overhead, process vs container.

    .venv/bin/python -m bench.runtime_start [--starts 20] [--cpu-runs 5] [--image NAME]

Start latency: from the agent's runner taking an assignment (`Runner.start`) to the job's first
log line reaching the runner's outbox (what the agent sends next), for the process runtime and
for the container runtime with the cached job image (the one `scripts/test-containers.sh`
builds; `--image` or RUNTIME_TEST_IMAGE). The portal's side (poll interval, sync) is the same for
both and not included. p50/p95 over `--starts` jobs each, alternating.

CPU overhead: the same CPU-bound workload (a pure-Python loop of fixed length, timed inside the
workload so start-up is excluded) as a bare process of the host's python3 and in a container of
the image's python3 (the same Debian package), alternating, `--cpu-runs` each. The overhead is
the median of the paired runs' ratios (each container run against the bare run just before it:
load drifts on a shared machine), in CPU time. Goals: container p50 start under 1.5 s; CPU overhead < 3 %.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from agent.runner import Assignment, Runner, agent_source_root
from agent.runtime import ContainerRuntime, ProcessRuntime
from bench import command_line, markdown_table, write_section

CPU_LOOP = (
    "import time; c, t = time.process_time(), time.perf_counter(); n = 0\n"
    "for i in range({n}): n += i * i % 7\n"
    "print('cpu-seconds', time.process_time() - c, time.perf_counter() - t, flush=True)"
)


def first_log_latency(runner: Runner, job_id: int, command: str) -> float:
    a = Assignment(job_id=job_id, attempt=1, action="run", command=command, grace_seconds=2)
    started = time.perf_counter()
    runner.start(a)
    while True:
        runner.poll()
        if any(m.kind == "logs" and m.job_id == job_id for m in runner.outbox):
            latency = time.perf_counter() - started
            break
        if any(m.kind == "exited" and m.job_id == job_id for m in runner.outbox):
            raise RuntimeError(f"job {job_id} ended without output: {list(runner.outbox)}")
        time.sleep(0.002)
    runner.wait_all(30)
    runner.outbox.clear()
    return latency


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def cpu_seconds(argv: list[str]) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of the loop, as the workload measured them."""
    out = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in out.splitlines() if ln.startswith("cpu-seconds"))
    return float(line.split()[1]), float(line.split()[2])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=20)
    parser.add_argument("--cpu-runs", type=int, default=11)
    parser.add_argument("--loop", type=int, default=4_000_000, help="CPU loop iterations")
    parser.add_argument("--image", default=os.environ.get("RUNTIME_TEST_IMAGE", ""))
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    if not args.image:
        raise SystemExit("no image: pass --image or source scripts/test-containers.sh first")

    root = Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    root.chmod(0o711)
    try:
        runners = {
            "process": Runner(root / "process", runtime=ProcessRuntime(), log_flush_s=0.0),
            "container": Runner(
                root / "container",
                runtime=ContainerRuntime(
                    default_image=args.image, agent_source=agent_source_root(), node_label="bench"
                ),
                log_flush_s=0.0,
            ),
        }
        latencies: dict[str, list[float]] = {name: [] for name in runners}
        for i in range(args.starts):
            for name, runner in runners.items():
                latencies[name].append(first_log_latency(runner, 1000 + i, "echo ready"))

        loop = CPU_LOOP.format(n=args.loop)
        podman = [
            "podman", "--runtime", "runc", "run", "--rm", "--network=none",
            "--ulimit=nofile=1024:1024", "--ulimit=nproc=4096:4096", "--cpus=1",
            args.image, "python3", "-c", loop,
        ]  # fmt: skip
        bare = ["/usr/bin/python3", "-c", loop]
        cpu: dict[str, list[float]] = {"process": [], "container": []}
        wall: dict[str, list[float]] = {"process": [], "container": []}
        for _ in range(args.cpu_runs):
            for name, argv in (("process", bare), ("container", podman)):
                used, took = cpu_seconds(argv)
                cpu[name].append(used)
                wall[name].append(took)
    finally:
        shutil.rmtree(root, ignore_errors=True)

    rows = [
        [
            name,
            str(len(values)),
            f"{statistics.median(values) * 1000:.0f} ms",
            f"{percentile(values, 0.95) * 1000:.0f} ms",
            f"{min(values) * 1000:.0f} ms",
        ]
        for name, values in latencies.items()
    ]
    start_table = markdown_table(["runtime", "starts", "p50", "p95", "min"], rows)
    med = {name: statistics.median(v) for name, v in cpu.items()}
    # Each container run against the bare run just before it: load drifts on a shared machine.
    paired = [c / p - 1 for p, c in zip(cpu["process"], cpu["container"], strict=True)]
    overhead = statistics.median(paired)
    cpu_table = markdown_table(
        ["workload", "runs", "CPU time, median", "wall time, median", "CPU time, all runs (s)"],
        [
            [
                name,
                str(len(v)),
                f"{med[name]:.3f} s",
                f"{statistics.median(wall[name]):.3f} s",
                ", ".join(f"{x:.2f}" for x in v),
            ]
            for name, v in cpu.items()
        ],
    )
    c50 = statistics.median(latencies["container"])
    spread = percentile(paired, 0.75) - percentile(paired, 0.25)
    if spread > 0.03:  # the machine's noise is larger than what is measured
        verdict = f"not resolved here: the paired runs' interquartile range is {spread:.0%}"
    else:
        verdict = "met" if overhead < 0.03 else "missed"
    summary = (
        f"Container start p50 {c50 * 1000:.0f} ms (goal < 1500 ms: "
        f"{'met' if c50 < 1.5 else 'missed'}); CPU overhead of the container "
        f"{overhead * 100:+.1f} % (median of the paired runs' ratios; ratio of the medians "
        f"{(med['container'] / med['process'] - 1) * 100:+.1f} %; paired ratios range "
        f"{min(paired) * 100:+.0f} % to {max(paired) * 100:+.0f} %, which is this machine's "
        f"noise) (goal < 3 %: {verdict})."
    )
    body = (
        "## Workload runtime: start latency and CPU overhead\n\n"
        f"`{command_line('bench.runtime_start')}`\n\n"
        "From `Runner.start` (the agent taking an assignment) to the job's first log line in "
        "the agent's outbox; the container runtime with the cached job image "
        f"(`{args.image}`, Debian bookworm minbase + python3, built by mmdebstrap), Podman "
        "4.3 with runc on cgroup v1, on the shared 2-core machine.\n\n"
        f"{start_table}\n\n"
        f"CPU-bound loop ({args.loop:,} iterations, timed inside the workload: CPU time by "
        "`time.process_time()`, which other work on the machine does not inflate the way it "
        "does wall time), bare process of the host's python3 vs the image's python3 in a "
        "container (`--cpus=1`), alternating:\n\n"
        f"{cpu_table}\n\n{summary}\n"
    )
    print(body)
    if not args.no_docs:
        write_section("runtime_start", body)


if __name__ == "__main__":
    main()
