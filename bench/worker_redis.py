"""Redis CPU per Celery task message, the capacity model's price for the worker's Redis work.

    .venv/bin/python -m bench.worker_redis [--messages 1500] [--rate 40] [--runs 3]

A Redis server of the benchmark's own (`bench.stack.private_redis`) is the broker and cache of a
real Celery worker (`celery -A config worker`, threads pool, the deployed queues). The benchmark
first measures the pair at rest (the worker's broker polls, the server's own timers), then sends
task messages at a steady rate and waits until the queues and the unacked set are empty:

- `notice`: `scheduler.job_notices` with no events (the broker's work for one message: publish,
  fetch, the unacked bookkeeping, the ack);
- `cycle`: `scheduler.cycle` on a database with nothing queued (the same, plus the cycle's
  single-flight lock taken and released in Redis).

Redis CPU (from /proc) over the window, less the rest rate × the window, ÷ messages: ms per
message. The INFO commandstats difference names the commands that cost it. Medians of runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import redis as redis_client

from bench import command_line, markdown_table, spread, write_section
from bench.stack import private_redis

REPO = Path(__file__).resolve().parent.parent
KINDS: dict[str, tuple[str, list[object]]] = {
    "notice": ("scheduler.job_notices", [[]]),
    "cycle": ("scheduler.cycle", []),
}


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def commandstats(r: redis_client.Redis) -> dict[str, tuple[int, int]]:
    info = r.info("commandstats")
    return {k.removeprefix("cmdstat_"): (v["calls"], v["usec"]) for k, v in info.items()}


def drained(r: redis_client.Redis) -> bool:
    queues = ("scheduler", "default", "telemetry", "billing")
    return all(r.llen(q) == 0 for q in queues) and r.hlen("unacked") == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1500)
    parser.add_argument("--rate", type=float, default=40.0, help="messages per second sent")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rest", type=float, default=10.0, help="seconds at rest measured")
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()

    url, server = private_redis()
    os.environ["REDIS_URL"] = url
    env = {**os.environ, "REDIS_URL": url, "DB_CONN_MAX_AGE": "60"}
    worker = subprocess.Popen(
        [
            *(sys.executable, "-m", "celery", "-A", "config", "worker"),
            *("-Q", "scheduler,default,telemetry,billing", "--pool", "threads", "-c", "2"),
            *("--loglevel", "WARNING"),
        ],
        cwd=REPO,
        env=env,
        start_new_session=True,
    )
    try:
        os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.local")
        import django

        django.setup()
        from config.celery import app

        r = redis_client.Redis.from_url(url)
        pid = int(r.info("server")["process_id"])
        time.sleep(15)  # the worker connects and settles
        results: dict[str, list[float]] = {k: [] for k in KINDS}
        rests: list[float] = []
        stats: dict[str, dict[str, tuple[int, int]]] = {}
        for _ in range(args.runs):
            t0, c0 = time.monotonic(), proc_cpu(pid)
            time.sleep(args.rest)
            rest = (proc_cpu(pid) - c0) / (time.monotonic() - t0)
            rests.append(rest * 1000)
            for kind, (name, task_args) in KINDS.items():
                before_stats = commandstats(r)
                t0, c0 = time.monotonic(), proc_cpu(pid)
                for i in range(args.messages):
                    app.send_task(name, args=task_args)
                    delay = t0 + (i + 1) / args.rate - time.monotonic()
                    if delay > 0:
                        time.sleep(delay)
                while not drained(r):
                    time.sleep(0.2)
                time.sleep(1.0)  # the last ack
                wall, cpu = time.monotonic() - t0, proc_cpu(pid) - c0
                results[kind].append((cpu - rest * wall) * 1000 / args.messages)
                after_stats = commandstats(r)
                stats[kind] = {
                    cmd: (
                        calls - before_stats.get(cmd, (0, 0))[0],
                        usec - before_stats.get(cmd, (0, 0))[1],
                    )
                    for cmd, (calls, usec) in after_stats.items()
                }
                print(kind, f"{results[kind][-1]:.3f} ms/message", f"rest {rest * 1000:.1f} ms/s")
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        server.terminate()
        server.wait(timeout=30)

    prices = {k: statistics.median(v) for k, v in results.items()}
    rows = [
        [
            f"`{KINDS[k][0]}`"
            + (" (nothing queued: broker + lock)" if k == "cycle" else " (broker only)"),
            spread(v, 3),
        ]
        for k, v in results.items()
    ]
    cmd_rows = []
    for kind, table in stats.items():
        for cmd, (calls, usec) in sorted(table.items(), key=lambda kv: -kv[1][1])[:8]:
            if calls:
                cmd_rows.append(
                    [kind, cmd, f"{calls / args.messages:.2f}", f"{usec / args.messages:.1f}"]
                )
    body = (
        "## Redis CPU per Celery task message (the capacity model's worker Redis)\n\n"
        f"`{command_line('bench.worker_redis')}` — a real Celery worker (threads pool, 2) on a "
        "Redis server of the benchmark's own; messages sent at "
        f"{args.rate:g}/s, {args.messages} per kind and run; Redis CPU from /proc over the "
        "window less the rest rate, ÷ messages; medians of "
        f"{args.runs} runs (min–max). Rest (worker connected, nothing sent): "
        f"{spread(rests, 1)} ms of Redis CPU per second.\n\n"
        + markdown_table(["message", "Redis CPU ms per message"], rows)
        + "\n\nWhat the last run's messages cost by command (INFO commandstats; Redis's own time "
        "inside commands, so less than its process CPU, which adds the network and event loop):\n\n"
        + markdown_table(["kind", "command", "calls per message", "µs per message"], cmd_rows)
        + f"\n\n<!-- worker_redis:data {json.dumps({'ms_per_message': prices})} -->\n"
    )
    print(body)
    if not args.no_docs:
        write_section("worker_redis", body)


if __name__ == "__main__":
    main()
