"""Many real node agents in one process, for load benchmarks that need hundreds of nodes.

    .venv/bin/python -m bench.agent_swarm TOKENS.json --portal URL [--poll 2] [--heartbeat 10] [--ramp 0]

TOKENS.json maps node names to agent tokens. Each node gets the real `agent.main.Agent` in its
own thread (simulated GPUs, real processes for the work). SIGTERM or SIGINT stops every agent the
way a node shutdown does: their work is stopped and the exits are reported before the process
ends. The load benchmark starts a few of these so the agents do not share the load generator's
interpreter lock.
"""

from __future__ import annotations

import argparse
import json
import signal
import tempfile
import threading
from pathlib import Path
from types import FrameType


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokens", type=Path)
    parser.add_argument("--portal", required=True)
    parser.add_argument("--gpus", default="8xH100-80GB-SXM")
    parser.add_argument("--poll", type=float, default=None)
    parser.add_argument("--heartbeat", type=float, default=None)
    parser.add_argument(
        "--ramp", type=float, default=0.0, help="start the agents evenly over this many seconds"
    )
    args = parser.parse_args()

    from agent.config import Config
    from agent.main import Agent

    tokens: dict[str, str] = json.loads(args.tokens.read_text(encoding="utf-8"))
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workroot = Path(tempfile.mkdtemp(prefix="bench-swarm-"))
    threads = []
    pause = args.ramp / max(1, len(tokens))
    for name, token in tokens.items():
        if stop.wait(pause):
            break
        config = Config(
            portal_url=args.portal,
            token=token,
            workdir=workroot / name,
            simulate=True,
            runtime="process",  # jobs here are trivial commands; no image
            sim_gpus=args.gpus,
            hostname=name,
            poll_interval_s=args.poll,
            heartbeat_interval_s=args.heartbeat,
            log_level="WARNING",
        )
        thread = threading.Thread(target=Agent(config).run, args=(stop,), name=name)
        thread.start()
        threads.append(thread)
    while not stop.is_set():
        stop.wait(1.0)
    for thread in threads:
        thread.join(timeout=60)


if __name__ == "__main__":
    main()
