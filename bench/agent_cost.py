"""The work of an agent's heartbeat and idle sync, in one process: CPU time, SQL statements.

    .venv/bin/python -m bench.agent_cost [--pool agent|web] [--requests 400] [--runs 5]
    .venv/bin/python -m bench.agent_cost --pool agent --reuse --only 20 --kind heartbeat

The agents' two most frequent requests go through Django's WSGI handler in this process, as
the pool named by `--pool` serves them: `agent`, the agent API pool (`config.wsgi_agent`: its
URL conf and middleware), or `web`, the web tier (`config.wsgi`), which serves agents where no
agent pool is deployed (and in `bench.submit_throughput`). A heartbeat carries 8 GPUs × 5
samples, as the agent sends every 5 s; an idle sync has nothing to report and is answered
`unchanged`. What an HTTP server adds is left out, so the figures are the portal's own work per
request; PostgreSQL's CPU is its backend's (from /proc). Persistent database connections and
the throttles count as in production (with room for every request).

Instruction counts move far less than CPU time on a shared machine:

    valgrind --tool=callgrind --instr-atstart=no .venv/bin/python -m bench.agent_cost \
        --pool agent --reuse --only 20 --kind heartbeat --callgrind

counts the instructions of 20 heartbeats only (see `bench.submit_cost`, whose approach this
follows; `--reuse` takes the database of an earlier plain run). Divide "Collected" by 20.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench import command_line, machine, markdown_table, spread, wsgi_environ

URLCONFS = {"agent": "config.urls_agent", "web": "config.urls"}


def _environ(path: str, token: str, body: bytes) -> dict[str, Any]:
    return wsgi_environ("POST", path, body, {"Authorization": f"Bearer {token}"})


class Agent:
    """Sends one node's heartbeats and idle syncs through the WSGI application."""

    def __init__(self, token: str, uuids: list[str]) -> None:
        from django.core.handlers.wsgi import WSGIHandler

        from bench.agent_requests import heartbeat_body

        self.app = WSGIHandler()
        self.token = token
        self.beat = json.dumps(heartbeat_body(uuids)).encode()
        self.version = self._post("/api/agent/v1/sync", b"{}")["version"]

    def _post(self, path: str, body: bytes) -> dict[str, Any]:
        status: list[str] = []
        result = self.app(_environ(path, self.token, body), lambda s, h, exc=None: status.append(s))
        answer = b"".join(result)
        result.close()  # request_finished: the connection is kept (CONN_MAX_AGE), as in gunicorn
        if not status[0].startswith("200"):
            raise SystemExit(f"{path} answered {status[0]}: {answer[:300]!r}")
        loaded: dict[str, Any] = json.loads(answer)
        return loaded

    def heartbeat(self) -> None:
        self._post("/api/agent/v1/heartbeat", self.beat)

    def sync(self) -> None:
        body = json.dumps({"version": self.version, "reports": []}).encode()
        answer = self._post("/api/agent/v1/sync", body)
        if not answer["unchanged"]:  # the version was forgotten (cache TTL): as an agent would
            self.version = answer["version"]


def reuse(db_suffix: str) -> tuple[str, list[str]] | None:
    """The node token and GPU uuids of the database an earlier run made (a new token)."""
    from bench.django_env import reuse as reuse_database

    if not reuse_database(db_suffix):
        return None
    from scheduler.models import Gpu, Node
    from scheduler.nodes import node_issue_agent_token

    node = Node.objects.filter(name="bench-1").first()
    if node is None:
        return None
    uuids = list(Gpu.objects.filter(node=node).order_by("index").values_list("uuid", flat=True))
    return node_issue_agent_token(node=node), uuids


def statements(send: Callable[[], None]) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        send()
    return len(ctx.captured_queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", choices=sorted(URLCONFS), default="agent")
    parser.add_argument("--requests", type=int, default=400, help="syncs per run (heartbeats: ¼)")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--only", type=int, help="set up, warm up, send this many, and exit")
    parser.add_argument("--kind", choices=["heartbeat", "sync"], default="heartbeat")
    parser.add_argument("--db-suffix", default="agentcost")
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="with --only, under valgrind --tool=callgrind --instr-atstart=no: count only them",
    )
    parser.add_argument("--reuse", action="store_true", help="reuse an earlier run's database")
    args = parser.parse_args()
    os.environ["PORTAL_URLCONF"] = URLCONFS[args.pool]
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
    os.environ.setdefault("DB_CONN_MAX_AGE", "60")
    for scope in ("RATE_AGENT", "RATE_AGENT_HEARTBEAT"):
        os.environ.setdefault(scope, "60000000/min")
    host = machine() if args.only is None else ""

    from bench.django_env import setup, teardown

    found = reuse(args.db_suffix) if args.reuse else None
    if found is None:
        setup(args.db_suffix)
        from bench.agent_requests import seed

        found = seed()
    token, uuids = found
    teardown()
    agent = Agent(token, uuids)
    for _ in range(args.warmup):
        agent.heartbeat()
        agent.sync()
    if args.only is not None:
        from bench.submit_cost import callgrind_instrumentation

        send = agent.heartbeat if args.kind == "heartbeat" else agent.sync
        if args.callgrind:
            callgrind_instrumentation("on")
        for _ in range(args.only):
            send()
        if args.callgrind:
            callgrind_instrumentation("off")
        teardown()
        return
    from bench.submit_cost import backend_cpu

    counts = {"heartbeat": statements(agent.heartbeat), "idle sync": statements(agent.sync)}
    results: dict[str, dict[str, list[float]]] = {
        k: {"cpu": [], "pg": []} for k in ("heartbeat", "idle sync")
    }
    for run in range(args.runs):
        for kind, send, n in (
            ("idle sync", agent.sync, args.requests),
            ("heartbeat", agent.heartbeat, max(1, args.requests // 4)),
        ):
            (pid0, pg0), c0 = backend_cpu(), time.process_time()
            for _ in range(n):
                send()
            c1 = time.process_time()
            pid1, pg1 = backend_cpu()
            results[kind]["cpu"].append((c1 - c0) / n * 1000)
            if pid1 == pid0:  # else the connection was renewed and took its count along
                results[kind]["pg"].append((pg1 - pg0) / n * 1000)
        print(f"run {run + 1} of {args.runs} done", flush=True)
    teardown()
    print(f"`{command_line('bench.agent_cost')}`\n")
    print(
        markdown_table(
            ["request", "portal CPU ms", "PostgreSQL CPU ms", "SQL statements"],
            [
                [kind, spread(r["cpu"], 3), spread(r["pg"], 3), str(counts[kind])]
                for kind, r in results.items()
            ],
        )
    )
    medians = {k: statistics.median(r["cpu"]) for k, r in results.items()}
    print(f"\n({args.pool} pool; medians of {args.runs} runs: {medians})\n")
    print(host)


if __name__ == "__main__":
    main()
