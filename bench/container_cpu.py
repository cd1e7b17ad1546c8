"""CPU overhead of the container on a CPU-bound workload, against the same workload as a bare
process, side by side in one run.

    .venv/bin/python -m bench.container_cpu [--pairs 15] [--loop 3000000] [--image NAME]

The workload is a pure-Python loop of fixed length, timed inside itself (CPU time by
`time.process_time()`, so start-up is excluded), run by the host's python3 as a bare process
(`taskset -c CPU`) and by the image's python3 (the same Debian package) in a container
(`podman --runtime runc run --cpuset-cpus CPU --cpus=1`), both pinned to the same CPU so that
each pays the same contention. Pairs alternate their order (bare first, then container first)
so that drift in the machine's load does not favour either. The overhead is the median of the
paired ratios (container / bare − 1), with a 95 % bootstrap interval (seeded). The goal is
under 3 %: met when the interval's upper end is below it, missed when its lower end is above
it, not resolved otherwise (the machine's noise is wider than the goal). The section records
the machine: CPU model, cores, load average before and after, kernel, Podman.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import subprocess
from pathlib import Path

from bench import command_line, machine, markdown_table, write_section
from bench.runtime_start import CPU_LOOP, cpu_seconds


def engine() -> str:
    cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    model = next(
        (line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if "model name" in line),
        platform.processor() or "unknown CPU",
    )
    engine = subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout
    return f"{model}, {os.cpu_count()} cores, Linux {platform.release()}, {engine.strip()}"


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


def bootstrap_median(
    values: list[float], *, rounds: int = 2000, seed: int = 7
) -> tuple[float, float]:
    """95 % bootstrap interval of the median of `values`."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return medians[int(0.025 * rounds)], medians[int(0.975 * rounds) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--loop", type=int, default=3_000_000, help="CPU loop iterations")
    parser.add_argument(
        "--cpu", type=int, default=(os.cpu_count() or 1) - 1, help="the CPU both run on"
    )
    parser.add_argument("--image", default=os.environ.get("RUNTIME_TEST_IMAGE", ""))
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    host = machine()
    if not args.image:
        raise SystemExit("no image: pass --image or source scripts/test-containers.sh first")

    loop = CPU_LOOP.format(n=args.loop)
    bare = ["taskset", "-c", str(args.cpu), "/usr/bin/python3", "-c", loop]
    container = [
        "podman", "--runtime", "runc", "run", "--rm", "--network=none",
        "--ulimit=nofile=1024:1024", "--ulimit=nproc=4096:4096",
        f"--cpuset-cpus={args.cpu}", "--cpus=1", args.image, "python3", "-c", loop,
    ]  # fmt: skip
    before = load()
    cpu: dict[str, list[float]] = {"bare process": [], "container": []}
    wall: dict[str, list[float]] = {"bare process": [], "container": []}
    for i in range(args.pairs):
        order = [("bare process", bare), ("container", container)]
        for name, argv in order if i % 2 == 0 else reversed(order):
            used, took = cpu_seconds(argv)
            cpu[name].append(used)
            wall[name].append(took)
    after = load()

    paired = [c / b - 1 for b, c in zip(cpu["bare process"], cpu["container"], strict=True)]
    overhead = statistics.median(paired)
    low, high = bootstrap_median(paired)
    if high < 0.03:
        verdict = "met"
    elif low > 0.03:
        verdict = "missed"
    else:
        verdict = "not resolved here: the interval spans the goal"
    table = markdown_table(
        ["workload", "runs", "CPU time, median", "wall time, median", "CPU time, all runs (s)"],
        [
            [
                name,
                str(len(v)),
                f"{statistics.median(v):.3f} s",
                f"{statistics.median(wall[name]):.3f} s",
                ", ".join(f"{x:.2f}" for x in v),
            ]
            for name, v in cpu.items()
        ],
    )
    body = (
        "## Workload runtime: CPU overhead of the container, side by side\n\n"
        f"`nice -n 10 {command_line('bench.container_cpu')}`\n\n"
        f"Host: {engine()}; load average (1, 5, 15 min) {before} before, {after} after "
        "(the shared development machine, other engineers' test runs included). Image "
        f"`{args.image}`. {args.loop:,} iterations of a pure-Python loop, CPU time measured "
        f"inside the workload; both pinned to CPU {args.cpu}; {args.pairs} pairs, alternating "
        "which runs first.\n\n"
        f"{table}\n\n"
        f"CPU overhead of the container: {overhead * 100:+.1f} % (median of the paired ratios; "
        f"95 % bootstrap interval {low * 100:+.1f} % to {high * 100:+.1f} %; paired ratios range "
        f"{min(paired) * 100:+.0f} % to {max(paired) * 100:+.0f} %). Goal < 3 %: {verdict}.\n\n"
        f"{host}\n"
    )
    print(body)
    if not args.no_docs:
        write_section("container_cpu", body)


if __name__ == "__main__":
    main()
