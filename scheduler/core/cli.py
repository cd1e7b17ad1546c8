"""`simulate`: replay traces through the scheduler core.

    python -m scheduler.core.cli packing --pods PODS.csv --nodes NODES.csv --policy fgd \\
        --seeds 42-51 --tune 1.3 [--batch N] [--format csv]
    python -m scheduler.core.cli queue --jobs JOBS.csv --gpus 32 --gpus-per-node 8 \\
        --policy backfill [--cluster ID] [--limit N] [--format csv]

Also available as ``python manage.py simulate ...``. Bad input files give a one-line error and
exit status 2.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TextIO

from scheduler.core.packing import simulate_packing
from scheduler.core.queueing import QUEUE_SIM_POLICIES, simulate_queue
from scheduler.core.scorers import SCORER_NAMES
from scheduler.core.traces import TraceError, read_jobs, read_nodes, read_pods

PACKING_COLUMNS = (
    "trace",
    "policy",
    "seed",
    "alloc_100",
    "alloc_130",
    "frag_ratio_90",
    "placed",
    "failed",
    "seconds",
)
QUEUE_COLUMNS = (
    "policy",
    "jobs",
    "avg_jct",
    "p50_jct",
    "p95_jct",
    "p99_jct",
    "avg_wait",
    "utilization",
    "makespan",
)


def parse_seeds(text: str) -> list[int]:
    """'42-51' or '42,45,50' or a mix: '42-44,50'."""
    out: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if "-" in part[1:]:
                lo, hi = part.split("-", 1)
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                out.extend(range(a, b + 1))
            else:
                out.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad seed list {text!r}; use e.g. 42-51 or 42,43"
        ) from None
    if not out:
        raise argparse.ArgumentTypeError("no seeds given")
    return out


def trace_name(path: str) -> str:
    stem = Path(path).stem
    return stem.removeprefix("openb_pod_list_")


def write_table(
    rows: Sequence[Sequence[object]], columns: Sequence[str], fmt: str, out: TextIO
) -> None:
    def cell(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.2f}" if abs(v) < 1e6 else f"{v:.0f}"
        return str(v)

    cells = [[cell(v) for v in r] for r in rows]
    if fmt == "csv":
        out.write(",".join(columns) + "\n")
        for r in cells:
            out.write(",".join(r) + "\n")
        return
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    out.write("  ".join(c.rjust(w) for c, w in zip(columns, widths, strict=True)) + "\n")
    for r in cells:
        out.write("  ".join(v.rjust(w) for v, w in zip(r, widths, strict=True)) + "\n")


class ProgressBar:
    """`[#####.....] 1,234/3,000 jobs  41%  ETA 1m12s` on one line of `out` (stderr), redrawn
    at most every `every` seconds; nothing at all when `out` is not a terminal unless forced."""

    def __init__(
        self,
        out: TextIO,
        *,
        unit: str,
        every: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        width: int = 30,
    ) -> None:
        self.out, self.unit, self.every, self.clock, self.width = out, unit, every, clock, width
        self.started = clock()
        self.last_draw = -1e9
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        now = self.clock()
        if now - self.last_draw < self.every and done < total:
            return
        self.last_draw = now
        self.out.write("\r" + self.line(done, total, now - self.started))
        self.out.flush()
        self.drawn = True

    def line(self, done: int, total: int, elapsed: float) -> str:
        frac = done / total if total else 1.0
        filled = int(frac * self.width)
        eta = "--" if done == 0 else format_eta(elapsed * (total - done) / done)
        return (
            f"[{'#' * filled}{'.' * (self.width - filled)}] {done:,}/{total:,} {self.unit}"
            f"  {frac:4.0%}  ETA {eta}"
        )

    def close(self) -> None:
        if self.drawn:
            self.out.write("\n")
            self.out.flush()


def format_eta(seconds: float) -> str:
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="simulate", description="Replay cluster traces through the scheduler core."
    )
    sub = p.add_subparsers(dest="command", required=True)
    pk = sub.add_parser("packing", help="arrival-only packing (FGD method)")
    pk.add_argument("--pods", required=True, help="pod list CSV (Alibaba openb format)")
    pk.add_argument("--nodes", required=True, help="node list CSV (Alibaba openb format)")
    pk.add_argument("--policy", default="default", choices=SCORER_NAMES)
    pk.add_argument("--seeds", type=parse_seeds, default=[42], help="e.g. 42-51")
    pk.add_argument("--tune", type=float, default=1.3, help="arrived load, × GPU capacity")
    pk.add_argument("--batch", type=int, default=1, help="plan N arrivals together via plan()")
    pk.add_argument("--format", choices=("table", "csv"), default="table")
    qu = sub.add_parser("queue", help="job arrivals and durations (Philly format)")
    qu.add_argument("--jobs", required=True, help="job CSV: timestamp,duration,num_gpus[,...]")
    qu.add_argument("--gpus", type=int, required=True, help="GPUs in the cluster")
    qu.add_argument("--gpus-per-node", type=int, default=8)
    qu.add_argument("--policy", default="backfill", choices=QUEUE_SIM_POLICIES)
    qu.add_argument("--scorer", default="default", choices=SCORER_NAMES)
    qu.add_argument("--cluster", default=None, help="only jobs of this virtual cluster")
    qu.add_argument("--limit", type=int, default=None, help="first N jobs only")
    qu.add_argument("--seed", type=int, default=0)
    qu.add_argument("--format", choices=("table", "csv"), default="table")
    for sp in (pk, qu):
        sp.add_argument(
            "--progress",
            choices=("auto", "always", "never"),
            default="auto",
            help="progress bar with ETA on stderr (auto: when stderr is a terminal)",
        )
    return p


INTERRUPTED = 130  # the shell's status for a run stopped by Ctrl-C


def main(
    argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None
) -> int:
    """Ctrl-C stops a run cleanly: the rows (or the queue figures) so far are printed, marked
    partial on stderr, and the exit status is 130."""
    out = out or sys.stdout
    err = err or sys.stderr
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse already printed the problem
        return int(exc.code or 0)
    try:
        if args.command == "packing":
            return _packing(args, out, err)
        return _queue(args, out, err)
    except (TraceError, ValueError) as exc:
        print(f"simulate: error: {exc}", file=err)
        return 2


def _packing(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`simulate packing`: one row per seed; Ctrl-C prints the seeds done so far."""
    if args.tune <= 0 or args.batch < 1:
        raise ValueError("--tune must be positive and --batch at least 1")
    nodes = read_nodes(args.nodes)
    pods = read_pods(args.pods)
    rows: list[list[object]] = []
    bar = _bar(args, err, unit="seeds")
    interrupted = False
    for n, seed in enumerate(args.seeds):
        if bar:
            bar(n, len(args.seeds))
        try:
            r = simulate_packing(
                nodes, pods, args.policy, seed, args.tune, trace_name(args.pods), args.batch
            )
        except KeyboardInterrupt:
            interrupted = True
            break
        rows.append(
            [
                r.trace,
                r.policy if args.batch == 1 else f"{r.policy}/batch{args.batch}",
                r.seed,
                r.alloc_at(100),
                r.alloc_at(130),
                r.frag_ratio_90,
                r.placed,
                r.failed,
                r.seconds,
            ]
        )
    if bar:
        if not interrupted:
            bar(len(args.seeds), len(args.seeds))
        bar.close()
    write_table(rows, PACKING_COLUMNS, args.format, out)
    if interrupted:
        print(
            f"simulate: interrupted: {len(rows)} of {len(args.seeds)} seeds done; "
            "the rows above are those.",
            file=err,
        )
        return INTERRUPTED
    return 0


def _queue(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    """`simulate queue`: one row of queue figures; Ctrl-C prints them over the jobs finished."""
    jobs = read_jobs(args.jobs, args.cluster, args.limit)
    bar = _bar(args, err, unit="jobs")
    q = simulate_queue(
        jobs,
        args.gpus,
        args.gpus_per_node,
        args.policy,
        args.scorer,
        args.seed,
        progress=bar,
    )
    if bar:
        bar.close()
    write_table(
        [
            [
                q.policy,
                q.jobs,
                q.avg_jct,
                q.p50_jct,
                q.p95_jct,
                q.p99_jct,
                q.avg_wait,
                q.utilization,
                q.makespan,
            ]
        ],
        QUEUE_COLUMNS,
        args.format,
        out,
    )
    if q.interrupted:
        print(
            f"simulate: interrupted: partial result over the {q.jobs:,} of {q.total:,} jobs "
            "finished by then.",
            file=err,
        )
        return INTERRUPTED
    return 0


def _bar(args: argparse.Namespace, err: TextIO, *, unit: str) -> ProgressBar | None:
    wanted = args.progress == "always" or (args.progress == "auto" and err.isatty())
    return ProgressBar(err, unit=unit) if wanted else None


if __name__ == "__main__":
    raise SystemExit(main())
