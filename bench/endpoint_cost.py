"""CPU per request of each endpoint class, the inputs of docs/capacity.md's model.

    .venv/bin/python -m bench.endpoint_cost [--requests 200] [--runs 5] [--nodes 50]

One gunicorn worker with one thread (the portal as deployed: production's persistent database
connections, WhiteNoise, every middleware) serves requests sent one at a time over a keep-alive
connection from this process, class after class, the classes alternating within each run:

- page view: the dashboard (`GET /`), the job list partial (`GET /jobs/`, htmx), the jobs API
  (`GET /api/v1/jobs`) and a job's chart series, in the mix `bench.load`'s users make;
- submit: `POST /api/v1/jobs` (one GPU, admitted and queued; no worker runs the cycle here);
- idle sync: an agent's sync with nothing to report, answered `unchanged`;
- busy sync: the syncs one job's life costs its node, in the order the agent sends them: the
  sync that finds the new assignment (answered in full), the one carrying its started report
  (answered `unchanged`), the one carrying its exit report (answered in full, the job gone);
  the node runs one other job meanwhile, as `bench.load`'s nodes run one or two;
- heartbeat: an agent's heartbeat, 8 GPUs × 5 samples;
- log append: a chunk of a running job's output (`POST .../jobs/<id>/logs`, 20 lines);
- metrics: a Prometheus scrape of `/metrics` with `--nodes` nodes × 8 GPUs registered.

Measured per class: the CPU time the gunicorn worker used (from /proc, so neither this client
nor anything else on the machine is counted), the CPU time of the PostgreSQL backends serving
this benchmark's database, the CPU time of a Redis server of the benchmark's own, and the
wall time, each divided by the requests; plus the SQL
statements per request (Django's test client in this process, once per class). CPU time, not
wall time, is what the capacity model needs and what other work on a shared machine inflates
least. Medians over runs, with the runs' min–max.

The busy-sync jobs are placed by the real scheduling cycle, run in this process between the
syncs (its CPU and its PostgreSQL backend's are measured apart: the worker's cost of a job,
"cycle per job"). The other nodes never register, so the cycle places only the busy-sync
node's jobs (an `A100-80GB` node of its own), and the submit class's jobs leave the queue
after each batch (the cycle plans a queue as short as `bench.load`'s).
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
from bench.stack import private_redis, wait_port

CLASSES = ["page view", "submit", "idle sync", "busy sync", "heartbeat", "log append", "metrics"]
METRICS_TOKEN = "bench-metrics-token"
BUSY_MODEL = "A100-80GB"
LOG_CHUNK = "".join(f"step {i}: loss 0.{i:04d} lr 3e-4 tokens/s 41234\n" for i in range(20))


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


REDIS_PID: list[int] = []  # the benchmark's own Redis server (`bench.stack.private_redis`)


def redis_cpu() -> float:
    """CPU seconds so far of the benchmark's own Redis server."""
    return proc_cpu(REDIS_PID[0]) if REDIS_PID else 0.0


def seed(nodes: int) -> dict[str, Any]:
    """The submit benchmark's project, user and nodes (never registered: the submit class's
    jobs only wait); one node heard by its agent; the busy-sync node (ready), the only one the
    cycle can place on."""
    from bench.submit_throughput import seed as seed_fleet
    from scheduler.models import Gpu, GpuModel, Node, Pool
    from scheduler.nodes import node_issue_agent_token
    from scheduler.seed import node_register_simulated

    secret, tokens = seed_fleet(nodes, "")
    first = sorted(tokens)[0]
    uuids = list(
        Gpu.objects.filter(node__name=first).order_by("index").values_list("uuid", flat=True)
    )
    busy = node_register_simulated(
        name="busy-0",
        pool=Pool.objects.get(name="default"),
        gpu_model=GpuModel.objects.get(name=BUSY_MODEL),
        gpu_count=8,
        cpu_milli=128_000,
        memory_mib=1_000_000,
        state=Node.State.READY,
    )
    return {
        "api": secret,
        "node": tokens[first],
        "uuids": uuids,
        "busy": node_issue_agent_token(node=busy),
    }


class Meter:
    """CPU and wall time accumulated over chosen stretches (the web worker's, this database's
    PostgreSQL backends', Redis's)."""

    def __init__(self, web_pid: int, dbname: str) -> None:
        self.web_pid, self.dbname = web_pid, dbname
        self.web = self.pg = self.redis = self.wall = 0.0
        self.pg_valid = True
        self._at: tuple[float, float, float, float] | None = None

    def start(self) -> None:
        self._at = (
            group_cpu(self.web_pid),
            backends_cpu(self.dbname),
            redis_cpu(),
            time.perf_counter(),
        )

    def stop(self) -> None:
        assert self._at is not None
        wall = time.perf_counter()
        web0, pg0, redis0, t0 = self._at
        web1, pg1, redis1 = group_cpu(self.web_pid), backends_cpu(self.dbname), redis_cpu()
        self.web += web1 - web0
        self.redis += redis1 - redis0
        self.wall += wall - t0
        if pg1 >= pg0:
            self.pg += pg1 - pg0
        else:  # a backend ended meanwhile, taking its CPU count along
            self.pg_valid = False
        self._at = None


def own_backend_cpu() -> float:
    """CPU seconds so far of this process's own PostgreSQL backend (the cycle's statements)."""
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    try:
        return proc_cpu(pid)
    except OSError:
        return 0.0


class BusyNode:
    """The busy-sync node's agent, played by hand: one job at a time placed by the real cycle
    (run here), then the three syncs of its life; a long-running job besides, whose output is
    the log-append class."""

    def __init__(self, url: str, token: str, api: requests.Session) -> None:
        self.url, self.api = url, api
        self.agent = requests.Session()
        self.agent.headers["Authorization"] = f"Bearer {token}"
        self.version: str | None = None
        self.count = 0
        self.seq = 0
        self.log_job: tuple[int, int] | None = None
        self.cycle_cpu = self.cycle_pg = self.cycle_wall = 0.0
        self.beat_at = time.monotonic()

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        resp = self.agent.post(f"{self.url}/api/agent/v1/{path}", json=body)
        if resp.status_code not in (200, 201):
            raise SystemExit(f"POST {path} answered {resp.status_code}: {resp.text[:300]}")
        answer: dict[str, Any] = resp.json()
        return answer

    def _submit(self, command: str) -> int:
        self.count += 1
        resp = self.api.post(
            f"{self.url}/api/v1/jobs",
            json={
                "project": "bench",
                "name": f"busy{self.count}",
                "command": command,
                "gpu_model": BUSY_MODEL,
            },
        )
        if resp.status_code != 201 or resp.json()["state"] != "queued":
            raise SystemExit(f"busy submit answered {resp.status_code}: {resp.text[:300]}")
        job_id: int = resp.json()["id"]
        return job_id

    def _cycle(self) -> None:
        from scheduler.cycle import run_cycle

        cpu0, pg0, t0 = time.process_time(), own_backend_cpu(), time.perf_counter()
        result = run_cycle()
        self.cycle_wall += time.perf_counter() - t0
        self.cycle_cpu += time.process_time() - cpu0
        self.cycle_pg += max(0.0, own_backend_cpu() - pg0)
        if not result.placed:
            raise SystemExit(f"the cycle placed nothing on the busy node: {result}")

    def _attempt(self, answer: dict[str, Any], job_id: int) -> int:
        for a in answer.get("assignments") or []:
            if a["job_id"] == job_id:
                return int(a["attempt"])
        raise SystemExit(f"job {job_id} is not in the busy node's assignments: {answer}")

    def start(self) -> None:
        job_id = self._submit("sleep 36000")
        self._cycle()
        answer = self._post("sync", {"version": self.version, "reports": []})
        attempt = self._attempt(answer, job_id)
        answer = self._post(
            "sync",
            {
                "version": answer["version"],
                "reports": [{"kind": "started", "job_id": job_id, "attempt": attempt, "pid": 4242}],
            },
        )
        self.version = answer["version"]
        self.log_job = (job_id, attempt)
        self.cycle_cpu = self.cycle_pg = self.cycle_wall = 0.0

    def one_job(self, meter: Meter | None, _cycle: Meter | None) -> None:
        """A job placed by the cycle (outside the meter), then its three syncs (inside)."""
        if time.monotonic() - self.beat_at > 10:  # the node stays ready (outside the meter)
            self._post("heartbeat", {"telemetry": [], "running": []})
            self.beat_at = time.monotonic()
        job_id = self._submit("true")
        self._cycle()
        if meter is not None:
            meter.start()
        answer = self._post("sync", {"version": self.version, "reports": []})  # the new job
        attempt = self._attempt(answer, job_id)
        version = answer["version"]
        answer = self._post(
            "sync",
            {
                "version": version,
                "reports": [{"kind": "started", "job_id": job_id, "attempt": attempt, "pid": 4243}],
            },
        )
        answer = self._post(
            "sync",
            {
                "version": answer["version"],
                "reports": [
                    {
                        "kind": "exited",
                        "job_id": job_id,
                        "attempt": attempt,
                        "exit_code": 0,
                        "reason": "exited",
                    }
                ],
            },
        )
        if meter is not None:
            meter.stop()
        if answer.get("unchanged"):
            raise SystemExit(f"the exit report left the assignments unchanged: {answer}")
        self.version = answer["version"]

    def log(self) -> None:
        assert self.log_job is not None
        job_id, attempt = self.log_job
        resp = self.agent.post(
            f"{self.url}/api/agent/v1/jobs/{job_id}/logs",
            json={"attempt": attempt, "seq": self.seq, "stream": "stdout", "text": LOG_CHUNK},
        )
        self.seq += 1
        if resp.status_code != 201:
            raise SystemExit(f"log append answered {resp.status_code}: {resp.text[:300]}")


def submitted_jobs_cancel() -> None:
    """The submit class's jobs leave the queue (as if their users cancelled them), so that the
    cycle run for the busy node plans a queue as short as `bench.load`'s."""
    from django.utils import timezone

    from scheduler.models import Job, JobState

    Job.objects.filter(state=JobState.QUEUED, gpu_model__name="H100-80GB-SXM").update(
        state=JobState.CANCELLED, finished_at=timezone.now()
    )


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
    # A Redis server of its own, so that its CPU time is this benchmark's alone
    redis_url, redis = private_redis()
    os.environ["REDIS_URL"] = redis_url
    REDIS_PID.append(redis.pid)
    try:
        measure(args, chosen, host)
    finally:
        redis.terminate()
        redis.wait(timeout=30)


UNLIMITED = {
    name: "6000000/min"
    for name in (
        "RATE_SUBMIT",
        "RATE_USER",
        "RATE_AGENT",
        "RATE_AGENT_HEARTBEAT",
        "RATE_AGENT_LOGS",
    )
}


def measure(args: argparse.Namespace, chosen: list[str], host: str) -> None:
    # The rates must not be what is measured, in the server nor in this process (its statement
    # counts share the node's throttle windows with the measured syncs).
    os.environ.update(UNLIMITED)
    db_url = setup("cost")
    dbname = db_url.rsplit("/", 1)[1]
    fixtures = seed(args.nodes)
    teardown()
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "DB_CONN_MAX_AGE": "60",
        **UNLIMITED,
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
        c: {"web": [], "pg": [], "redis": [], "wall": []} for c in [*CLASSES, "cycle per job"]
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
        busy = BusyNode(url, fixtures["busy"], api)
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
            "idle sync": lambda i: ok(
                agent.post(f"{url}/api/agent/v1/sync", json={"version": version, "reports": []})
            ),
            "heartbeat": lambda i: ok(agent.post(f"{url}/api/agent/v1/heartbeat", json=beat)),
            "log append": lambda i: busy.log(),
            "metrics": lambda i: ok(
                requests.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
            ),
        }
        busy.start()  # the node's long-running job (the log chunks' job)
        for name in chosen:  # warm every path up, not recorded
            if name == "busy sync":
                for _ in range(3):
                    busy.one_job(None, None)
                busy.cycle_cpu = busy.cycle_pg = busy.cycle_wall = 0.0
                continue
            for i in range(20):
                senders[name](i)
        submitted_jobs_cancel()
        for run in range(args.runs):
            for name in chosen:
                meter = Meter(web.pid, dbname)
                if name == "busy sync":
                    jobs = max(4, args.requests // 3)
                    cycle = Meter(web.pid, dbname)
                    for _ in range(jobs):
                        busy.one_job(meter, cycle)
                    n = 3 * jobs
                    results["cycle per job"]["web"].append(busy.cycle_cpu / jobs)
                    results["cycle per job"]["pg"].append(busy.cycle_pg / jobs)
                    results["cycle per job"]["wall"].append(busy.cycle_wall / jobs)
                    busy.cycle_cpu = busy.cycle_pg = busy.cycle_wall = 0.0
                else:
                    n = max(10, args.requests // (10 if name == "metrics" else 1))
                    meter.start()
                    for i in range(n):
                        senders[name](i)
                    meter.stop()
                    if name == "submit":
                        submitted_jobs_cancel()
                results[name]["web"].append(meter.web / n)
                if meter.pg_valid:
                    results[name]["pg"].append(meter.pg / n)
                results[name]["redis"].append(meter.redis / n)
                results[name]["wall"].append(meter.wall / n)
            print(f"run {run + 1} of {args.runs} done", flush=True)
    finally:
        web.terminate()
        web.wait(timeout=30)
    queries = count_queries(fixtures, job)
    teardown()
    rows = []
    for name in [*chosen, *(["cycle per job"] if "busy sync" in chosen else [])]:
        r = results[name]
        web_ms = statistics.median(r["web"]) * 1000
        pg_ms = statistics.median(r["pg"] or [0.0]) * 1000
        rows.append(
            [
                name if name != "cycle per job" else "cycle per job (worker, not web)",
                spread([v * 1000 for v in r["web"]]),
                spread([v * 1000 for v in r["pg"]]),
                spread([v * 1000 for v in r["redis"]]) if r["redis"] else "–",
                f"{web_ms + pg_ms:.1f}",
                f"{1000 / max(web_ms + pg_ms, 1e-9):,.0f}",
                f"{1000 / max(web_ms, 1e-9):,.0f}",
                spread([v * 1000 for v in r["wall"]]),
                f"{queries[name]:g}" if name in queries else "–",
            ]
        )
    table = markdown_table(
        [
            "endpoint class",
            "web CPU ms/request (median, min–max)",
            "PostgreSQL CPU ms/request",
            "Redis CPU ms/request",
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
            "redis_ms": statistics.median(results[name]["redis"] or [0.0]) * 1000,
            "queries": queries.get(name, 0.0),
        }
        for name in [*chosen, *(["cycle per job"] if "busy sync" in chosen else [])]
    }
    print(json.dumps(data))
    if not args.no_docs:
        write_section(
            "endpoint_cost",
            "## CPU per request, by endpoint class (the capacity model's inputs)\n\n"
            f"`{command_line('bench.endpoint_cost')}` — one gunicorn worker, one thread, "
            "persistent database connections; requests one at a time over keep-alive, the "
            f"classes alternating within each of {args.runs} runs ({args.requests} requests "
            f"per class and run, {max(10, args.requests // 10)} scrapes, "
            f"{3 * max(4, args.requests // 3)} busy syncs: {max(4, args.requests // 3)} jobs "
            "× 3); CPU from /proc: the gunicorn worker's, the PostgreSQL backends' of this "
            "benchmark's database only, and a Redis server's of the benchmark's own. Page view is `bench.load`'s users' mix (30% dashboard, 20% job list "
            "partial, 20% jobs API, 30% chart series); a busy sync is one of the three a job's "
            "life costs its node (the new assignment answered in full, the started report, "
            "the exit report answered in full); heartbeat is 8 GPUs × 5 samples; log append "
            f"is a 20-line chunk; metrics is a scrape with {args.nodes} nodes × 8 GPUs "
            "registered. *Cycle per job* is the scheduling cycle that placed each busy-sync "
            "job, run in the benchmark's process (its CPU time there, and its own PostgreSQL "
            "backend's): the worker's share of a job.\n\n"
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
        "idle sync": [
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
        # The busy node's syncs and log chunks, through the test client: statements counted
        # over the three syncs of one job (the cycle that places it is not counted).
        busy = BusyNode("", fixtures["busy"], TestSession(api))  # type: ignore[arg-type]
        node_client = APIClient()
        node_client.credentials(HTTP_AUTHORIZATION=f"Bearer {fixtures['busy']}")
        busy.agent = TestSession(node_client)  # type: ignore[assignment]
        busy.version = None
        busy.start()
        busy.log()
        with CaptureQueriesContext(connection) as ctx:
            busy.log()
        out["log append"] = float(len(ctx.captured_queries))
        counted: list[int] = []

        class Counting:
            def start(self) -> None:
                self.ctx = CaptureQueriesContext(connection)
                self.ctx.__enter__()

            def stop(self) -> None:
                self.ctx.__exit__(None, None, None)
                counted.append(len(self.ctx.captured_queries))

        for _ in range(3):
            busy.one_job(Counting(), None)  # type: ignore[arg-type]
        out["busy sync"] = round(statistics.median(counted) / 3, 1)
    return out


class TestSession:
    """`requests.Session`'s `post(url, json=...)` over Django's test client (URL path only)."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def post(self, url: str, json: Any) -> Any:
        path = "/" + url.split("://", 1)[-1].split("/", 1)[-1] if "://" in url else url
        resp = self.client.post(path, json, format="json")
        resp.text = resp.content.decode()
        return resp


if __name__ == "__main__":
    main()
