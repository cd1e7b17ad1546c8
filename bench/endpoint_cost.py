"""CPU per request of each endpoint class, the inputs of docs/capacity.md's model.

    .venv/bin/python -m bench.endpoint_cost [--requests 200] [--runs 5] [--nodes 50]

One gunicorn worker with one thread (the portal as deployed: production's persistent database
connections, WhiteNoise, every middleware) serves requests sent one at a time over a keep-alive
connection from this process, class after class, the classes alternating within each run:

- page view: the dashboard (`GET /`), the job list partial (`GET /jobs/`, htmx), the jobs API
  (`GET /api/v1/jobs`) and a job's chart series, in the mix `bench.load`'s users make;
- submit: `POST /api/v1/jobs` (one GPU, admitted and queued; no worker runs the cycle here);
- sync: an agent's idle sync (`unchanged`);
- heartbeat: an agent's heartbeat, 8 GPUs × 5 samples;
- metrics: a Prometheus scrape of `/metrics` with `--nodes` nodes × 8 GPUs registered.

Measured per class: the CPU time the gunicorn worker used (from /proc, so neither this client
nor anything else on the machine is counted), the CPU time of the PostgreSQL backends serving
this benchmark's database, and the wall time, each divided by the requests; plus the SQL
statements per request (Django's test client in this process, once per class). CPU time, not
wall time, is what the capacity model needs and what other work on a shared machine inflates
least. Medians over runs, with the runs' min–max.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import requests

from bench import REPO, command_line, machine, markdown_table, spread, write_section
from bench.agent_requests import heartbeat_body
from bench.django_env import setup, teardown
from bench.stack import wait_port

CLASSES = ["page view", "submit", "sync", "heartbeat", "metrics"]
METRICS_TOKEN = "bench-metrics-token"


def proc_cpu(pid: int) -> float:
    """CPU seconds of one process so far (user + system, with reaped children)."""
    raw = Path(f"/proc/{pid}/stat").read_text()
    fields = raw[raw.rindex(")") + 2 :].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def group_cpu(pgid: int) -> float:
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            raw = (entry / "stat").read_text()
        except OSError:
            continue
        fields = raw[raw.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid:
            total += sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


def backends_cpu(dbname: str) -> float:
    """CPU seconds so far of the PostgreSQL backends connected to `dbname` (the server is
    shared with others' work; only this database's backends are counted)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            [dbname],
        )
        pids = [row[0] for row in cur.fetchall()]
    total = 0.0
    for pid in pids:
        # not on this host's /proc (a remote server): PostgreSQL CPU reads 0
        with contextlib.suppress(OSError):
            total += proc_cpu(pid)
    return total


def seed(nodes: int) -> dict[str, Any]:
    """The submit benchmark's project, user and nodes; one node registered by its agent."""
    from bench.submit_throughput import seed as seed_fleet
    from scheduler.models import Gpu

    secret, tokens = seed_fleet(nodes, "")
    first = sorted(tokens)[0]
    uuids = list(
        Gpu.objects.filter(node__name=first).order_by("index").values_list("uuid", flat=True)
    )
    return {"api": secret, "node": tokens[first], "uuids": uuids}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="per class and run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=50, help="registered (for /metrics)")
    parser.add_argument("--port", type=int, default=8767)
    parser.add_argument(
        "--classes", default=",".join(CLASSES), help="comma-separated subset (implies --no-docs)"
    )
    parser.add_argument("--no-docs", action="store_true")
    args = parser.parse_args()
    chosen = [c for c in CLASSES if c in args.classes.split(",")]
    args.no_docs = args.no_docs or chosen != CLASSES
    host = machine()
    db_url = setup("cost")
    dbname = db_url.rsplit("/", 1)[1]
    fixtures = seed(args.nodes)
    teardown()
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "DB_CONN_MAX_AGE": "60",
        "RATE_SUBMIT": "6000000/min",
        "RATE_USER": "6000000/min",
        "RATE_AGENT": "6000000/min",
        "METRICS_TOKEN": METRICS_TOKEN,
    }
    web = subprocess.Popen(
        [
            *(sys.executable, "-m", "gunicorn", "config.wsgi", "-b", f"127.0.0.1:{args.port}"),
            *("-w", "1", "--threads", "1", "--log-level", "warning"),
        ],
        cwd=REPO,
        env=env,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{args.port}"
    results: dict[str, dict[str, list[float]]] = {
        c: {"web": [], "pg": [], "wall": []} for c in CLASSES
    }
    try:
        wait_port(url)
        from bench.load import login

        user = login(url, "bench@example.org", "x")
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {fixtures['api']}"
        agent = requests.Session()
        agent.headers["Authorization"] = f"Bearer {fixtures['node']}"
        version = agent.post(f"{url}/api/agent/v1/sync", json={}).json()["version"]
        beat = heartbeat_body(fixtures["uuids"])
        job = api.post(
            f"{url}/api/v1/jobs",
            json={
                "project": "bench",
                "name": "chart",
                "command": "true",
                "gpu_model": "H100-80GB-SXM",
            },
        ).json()["id"]
        counter = iter(range(10**9))

        def ok(resp: requests.Response) -> None:
            if resp.status_code not in (200, 201):
                raise SystemExit(f"{resp.request.method} {resp.url} answered {resp.status_code}")

        pages = [
            (0.3, lambda: user.get(f"{url}/")),
            (0.2, lambda: user.get(f"{url}/jobs/", headers={"HX-Request": "true"})),
            (0.2, lambda: api.get(f"{url}/api/v1/jobs?limit=20")),
            (0.3, lambda: api.get(f"{url}/api/v1/monitoring/jobs/{job}/series?range=15m")),
        ]

        def page_view(i: int) -> None:
            # the users' mix of bench.load (30% dashboard, 20% list, 20% API, 30% chart)
            slot = (i % 10) / 10
            edge = 0.0
            for share, send in pages:
                edge += share
                if slot < edge - 1e-9:
                    ok(send())
                    return

        senders: dict[str, Callable[[int], None]] = {
            "page view": page_view,
            "submit": lambda i: ok(
                api.post(
                    f"{url}/api/v1/jobs",
                    json={
                        "project": "bench",
                        "name": f"c{next(counter)}",
                        "command": "sleep 3600",
                        "gpu_model": "H100-80GB-SXM",
                    },
                )
            ),
            "sync": lambda i: ok(
                agent.post(f"{url}/api/agent/v1/sync", json={"version": version, "reports": []})
            ),
            "heartbeat": lambda i: ok(agent.post(f"{url}/api/agent/v1/heartbeat", json=beat)),
            "metrics": lambda i: ok(
                requests.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
            ),
        }
        senders = {name: senders[name] for name in chosen}
        for send in senders.values():  # warm every path up, not recorded
            for i in range(20):
                send(i)
        for run in range(args.runs):
            for name, send in senders.items():
                n = max(10, args.requests // (10 if name == "metrics" else 1))
                web0, pg0, t0 = group_cpu(web.pid), backends_cpu(dbname), time.perf_counter()
                for i in range(n):
                    send(i)
                wall = time.perf_counter() - t0
                web1, pg1 = group_cpu(web.pid), backends_cpu(dbname)
                results[name]["web"].append((web1 - web0) / n)
                if pg1 >= pg0:  # else a backend ended meanwhile, taking its CPU count along
                    results[name]["pg"].append((pg1 - pg0) / n)
                results[name]["wall"].append(wall / n)
            print(f"run {run + 1} of {args.runs} done", flush=True)
    finally:
        web.terminate()
        web.wait(timeout=30)
    queries = count_queries(fixtures, job)
    teardown()
    rows = []
    for name in chosen:
        r = results[name]
        web_ms = statistics.median(r["web"]) * 1000
        pg_ms = statistics.median(r["pg"] or [0.0]) * 1000
        rows.append(
            [
                name,
                spread([v * 1000 for v in r["web"]]),
                spread([v * 1000 for v in r["pg"]]),
                f"{web_ms + pg_ms:.1f}",
                f"{1000 / max(web_ms + pg_ms, 1e-9):,.0f}",
                f"{1000 / max(web_ms, 1e-9):,.0f}",
                spread([v * 1000 for v in r["wall"]]),
                f"{queries[name]:g}",
            ]
        )
    table = markdown_table(
        [
            "endpoint class",
            "web CPU ms/request (median, min–max)",
            "PostgreSQL CPU ms/request",
            "web + PostgreSQL ms",
            "requests per core-second",
            "per web core-second",
            "wall ms/request",
            "SQL statements",
        ],
        rows,
    )
    print(table)
    data = {
        name: {
            "web_ms": statistics.median(results[name]["web"]) * 1000,
            "pg_ms": statistics.median(results[name]["pg"] or [0.0]) * 1000,
            "queries": queries[name],
        }
        for name in chosen
    }
    print(json.dumps(data))
    if not args.no_docs:
        write_section(
            "endpoint_cost",
            "## CPU per request, by endpoint class (the capacity model's inputs)\n\n"
            f"`{command_line('bench.endpoint_cost')}` — one gunicorn worker, one thread, "
            "persistent database connections; requests one at a time over keep-alive, the "
            f"classes alternating within each of {args.runs} runs ({args.requests} requests "
            f"per class and run, {max(10, args.requests // 10)} scrapes); CPU from /proc: "
            "the gunicorn worker's, and the PostgreSQL backends' of this benchmark's database "
            f"only. Page view is `bench.load`'s users' mix (30% dashboard, 20% job list "
            "partial, 20% jobs API, 30% chart series); heartbeat is 8 GPUs × 5 samples; "
            f"metrics is a scrape with {args.nodes} nodes × 8 GPUs registered.\n\n"
            + table
            + "\n\n"
            + host
            + "\n\n<!-- endpoint_cost:data "
            + json.dumps(data, sort_keys=True)
            + " -->",
        )


def count_queries(fixtures: dict[str, Any], job: int) -> dict[str, float]:
    """SQL statements per request of each class (Django's test client in this process; the
    page-view figure is the mix's weighted mean)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext, setup_test_environment
    from rest_framework.test import APIClient

    from portal.models import User
    from scheduler.models import Gpu

    setup_test_environment()
    user = APIClient()
    user.force_login(User.objects.get(email="bench@example.org"))
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {fixtures['api']}")
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {fixtures['node']}")
    uuids = list(Gpu.objects.filter(uuid__in=fixtures["uuids"]).values_list("uuid", flat=True))
    version = agent.post("/api/agent/v1/sync", {}, format="json").json()["version"]
    metrics = APIClient()
    metrics.credentials(HTTP_AUTHORIZATION=f"Bearer {METRICS_TOKEN}")
    body = {"project": "bench", "command": "sleep 3600", "gpu_model": "H100-80GB-SXM"}
    sends: dict[str, list[tuple[float, Callable[[], Any]]]] = {
        "page view": [
            (0.3, lambda: user.get("/")),
            (0.2, lambda: user.get("/jobs/", HTTP_HX_REQUEST="true")),
            (0.2, lambda: api.get("/api/v1/jobs?limit=20")),
            (0.3, lambda: api.get(f"/api/v1/monitoring/jobs/{job}/series?range=15m")),
        ],
        "submit": [(1.0, lambda: api.post("/api/v1/jobs", {**body, "name": "q"}, format="json"))],
        "sync": [
            (
                1.0,
                lambda: agent.post(
                    "/api/agent/v1/sync", {"version": version, "reports": []}, format="json"
                ),
            )
        ],
        "heartbeat": [
            (
                1.0,
                lambda: agent.post("/api/agent/v1/heartbeat", heartbeat_body(uuids), format="json"),
            )
        ],
        "metrics": [(1.0, lambda: metrics.get("/metrics"))],
    }
    from django.test import override_settings

    out: dict[str, float] = {}
    with override_settings(METRICS_TOKEN=METRICS_TOKEN):
        for name, parts in sends.items():
            total = 0.0
            for share, send in parts:
                send()
                with CaptureQueriesContext(connection) as ctx:
                    send()
                total += share * len(ctx.captured_queries)
            out[name] = round(total, 1)
    return out


if __name__ == "__main__":
    main()
