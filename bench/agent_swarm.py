"""Many real node agents in one process, for load benchmarks that need hundreds of nodes.

    .venv/bin/python -m bench.agent_swarm TOKENS.json --portal URL [--poll 2] [--heartbeat 10] [--ramp 0] [--stats OUT.json]

TOKENS.json maps node names to agent tokens. Each node gets the real `agent.main.Agent` in its
own thread (simulated GPUs, real processes for the work). SIGTERM or SIGINT stops every agent the
way a node shutdown does: their work is stopped and the exits are reported before the process
ends. The load benchmark starts a few of these so the agents do not share the load generator's
interpreter lock.

With `--stats`, every HTTP exchange an agent makes is timed on the agent's side (the latency a
node sees, queueing in front of the portal included) and classed as the capacity model classes
agent requests (heartbeat, idle sync, busy sync, log append, other); at exit the file gets, per
class, the latencies and failures, and per node the longest gap between two heartbeats the
portal answered, with how much of that gap the agent spent waiting on the portal and how late
its loop sent the heartbeat that ended it (the swarm itself falling behind). That tells a node
the portal could not hear from one whose agent could not speak.
"""

from __future__ import annotations

import argparse
import itertools
import json
import signal
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from types import FrameType
from typing import Any


def sync_class(data: bytes | None, answer: object) -> str:
    """`idle sync` (no reports, answered unchanged) or `busy sync` (reports, or assignments
    answered in full)."""
    try:
        body = json.loads(data or b"{}")
    except ValueError:
        body = {}
    if not body.get("reports") and isinstance(answer, dict) and answer.get("unchanged"):
        return "idle sync"
    return "busy sync"


def request_class(path: str, data: bytes | None, answer: object) -> str:
    if path.endswith("/heartbeat"):
        return "heartbeat"
    if path.endswith("/sync"):
        return sync_class(data, answer)
    if path.endswith("/logs"):
        return "log append"
    return "other agent request"


class Recorder:
    """Per-node timings of every exchange (wrapping `PortalClient._attempt`)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        # node -> [(start, seconds, class, answered)]
        self.exchanges: dict[str, list[tuple[float, float, str, bool]]] = defaultdict(list)
        # node -> [(monotonic when the portal answered a heartbeat)]
        self.heartbeats: dict[str, list[float]] = defaultdict(list)

    def wrap(self, name: str, client: Any) -> None:
        from agent.client import _Transient

        attempt = client._attempt

        def timed(method: str, path: str, data: bytes | None) -> Any:
            started = time.monotonic()
            result: Any = None
            try:
                result = attempt(method, path, data)
                return result
            finally:
                seconds = time.monotonic() - started
                answered = result is not None and not isinstance(result, _Transient)
                kind = request_class(path, data, result if answered else None)
                if not answered and path.endswith("/sync"):
                    kind = "sync (no answer)"
                with self.lock:
                    self.exchanges[name].append((started, seconds, kind, answered))
                    if answered and kind == "heartbeat":
                        self.heartbeats[name].append(started + seconds)

        client._attempt = timed

    def summary(self, since: float, interval: float) -> dict[str, Any]:
        """What happened after `since` (monotonic): latencies by class, and each node's
        longest heartbeat gap, split into the time spent in exchanges with the portal and
        the rest (the agent's own loop, or the swarm's process waiting for a core)."""
        nodes: dict[str, dict[str, float]] = {}
        with self.lock:
            for name, beats in self.heartbeats.items():
                beats = [b for b in beats if b >= since]
                if len(beats) < 2:
                    continue
                gaps = [(b - a, a, b) for a, b in itertools.pairwise(beats)]
                gap, a, b = max(gaps)
                # the heartbeats' own exchanges (syncs run beside them on another connection)
                waiting = sum(
                    min(s + d, b) - max(s, a)
                    for s, d, k, _ok in self.exchanges[name]
                    if k == "heartbeat" and s < b and s + d > a
                )
                nodes[name] = {"max_gap_s": gap, "waiting_on_portal_s": waiting}
            latency: dict[str, list[float]] = defaultdict(list)
            failed: dict[str, int] = defaultdict(int)
            for exchanges in self.exchanges.values():
                for started, seconds, kind, answered in exchanges:
                    if started < since:
                        continue
                    if answered:
                        latency[kind].append(seconds)
                    else:
                        failed[kind] += 1
        return {
            "interval_s": interval,
            "latency": latency,
            "failed": failed,
            "nodes": nodes,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tokens", type=Path)
    parser.add_argument("--portal", required=True)
    parser.add_argument("--gpus", default="8xH100-80GB-SXM")
    parser.add_argument("--poll", type=float, default=None)
    parser.add_argument("--heartbeat", type=float, default=None)
    parser.add_argument(
        "--events",
        default="",
        help="the events service's URL: the agents watch their assignments there (else they "
        "only poll)",
    )
    parser.add_argument(
        "--ramp", type=float, default=0.0, help="start the agents evenly over this many seconds"
    )
    parser.add_argument("--stats", type=Path, default=None, help="write timings here at exit")
    parser.add_argument(
        "--mark",
        type=Path,
        default=None,
        help="a file whose appearance starts the measured window (its stats only)",
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
    recorder = Recorder()
    threads = []
    pause = args.ramp / max(1, len(tokens))
    interval = 0.0
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
            watch=bool(args.events),
            events_url=args.events,
            log_level="WARNING",
        )
        agent = Agent(config)
        interval = agent.heartbeat_interval_s
        if args.stats is not None:
            recorder.wrap(name, agent.client)
            recorder.wrap(name, agent.beat_client)  # heartbeats have a client of their own
        thread = threading.Thread(target=agent.run, args=(stop,), name=name)
        thread.start()
        threads.append(thread)
    since = None
    while not stop.is_set():
        stop.wait(1.0)
        if since is None and args.mark is not None and args.mark.exists():
            since = time.monotonic()
    ended = recorder.summary(since if since is not None else 0.0, interval)  # before shutdown
    for thread in threads:
        thread.join(timeout=60)
    if args.stats is not None:
        args.stats.write_text(json.dumps(ended), encoding="utf-8")


if __name__ == "__main__":
    main()
