"""Load: users browse and poll charts while nodes heartbeat and jobs are submitted.

    .venv/bin/python -m bench.load [--users 200] [--nodes 1000] [--submit-rate 50] [--seconds 600]

The issue's full scale is 200 users, 1,000 nodes and 50 submits/s for 10 minutes; the defaults
here are that scale, and the flags shrink it for a 2-core machine (the run recorded in
docs/benchmarks.md says which scale it used). Stack: gunicorn, a Celery worker and beat,
PostgreSQL and Redis, one in-process simulated agent per node. Reported per endpoint: requests,
errors (5xx or no answer), throttled (429), p50/p95/p99 latency; the scheduler's cycle time;
and the invariants checked at the end (no GPU over capacity at any instant, no job active twice,
no usage slice or invoice counted twice).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from bench import command_line, markdown_table, write_section
from bench.django_env import setup, teardown
from bench.stack import Stack, cpu_seconds, cpu_table, database_backends, private_redis
from bench.submit_throughput import seed

Samples = dict[str, list[float]]


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.latency: Samples = defaultdict(list)
        self.errors: dict[str, int] = defaultdict(int)
        self.unanswered: dict[str, int] = defaultdict(int)
        self.throttled: dict[str, int] = defaultdict(int)

    def call(
        self, name: str, session: requests.Session, method: str, url: str, **kw: object
    ) -> requests.Response | None:
        t = time.perf_counter()
        try:
            resp = session.request(method, url, timeout=30, **kw)  # type: ignore[arg-type]
        except requests.RequestException:
            with self.lock:
                self.errors[name] += 1
                self.unanswered[name] += 1
            return None
        elapsed = time.perf_counter() - t
        with self.lock:
            self.latency[name].append(elapsed)
            if resp.status_code >= 500:
                self.errors[name] += 1
            elif resp.status_code == 429:
                self.throttled[name] += 1
        return resp


def login(url: str, email: str, password: str) -> requests.Session:
    s = requests.Session()
    s.get(f"{url}/login/", timeout=30)
    s.post(
        f"{url}/login/",
        data={
            "username": email,
            "password": password,
            "csrfmiddlewaretoken": s.cookies["csrftoken"],
        },
        headers={"Referer": f"{url}/login/"},
        timeout=30,
    )
    return s


def browse(
    rec: Recorder,
    url: str,
    session: requests.Session,
    api: requests.Session,
    stop: threading.Event,
    rng: random.Random,
) -> None:
    job_id = None
    while not stop.is_set():
        page = rng.random()
        if page < 0.3:
            rec.call("GET / (dashboard)", session, "GET", f"{url}/")
        elif page < 0.5:
            rec.call(
                "GET /jobs/ (htmx list)",
                session,
                "GET",
                f"{url}/jobs/",
                headers={"HX-Request": "true"},
            )
        elif page < 0.7:
            r = rec.call("GET /api/v1/jobs", api, "GET", f"{url}/api/v1/jobs?limit=20")
            if r is not None and r.status_code == 200 and r.json()["results"]:
                job_id = r.json()["results"][0]["id"]
        elif job_id is not None:
            rec.call(
                "GET job chart series",
                api,
                "GET",
                f"{url}/api/v1/monitoring/jobs/{job_id}/series?range=15m",
            )
        stop.wait(rng.uniform(1.0, 3.0))  # a person polling every few seconds


def submit(
    rec: Recorder, url: str, api: requests.Session, rate: float, stop: threading.Event
) -> None:
    """Open loop: one submission every 1/rate seconds whatever the latency (a pool sends them)."""
    if rate <= 0:
        return
    i = 0
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=64) as pool:
        while not stop.is_set():
            body = {
                "project": "bench",
                "name": f"l{i}",
                "command": "sleep 30",
                "gpu_model": "H100-80GB-SXM",
            }
            pool.submit(rec.call, "POST /api/v1/jobs", api, "POST", f"{url}/api/v1/jobs", json=body)
            i += 1
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                stop.wait(delay)


def watch_cycles(
    stop: threading.Event, seen: dict[float, float], running: list[int] | None = None
) -> None:
    """Every cycle's duration, read from what the cycle task publishes (its `at` is the key);
    with `running`, the jobs running every 2 s (the cycle's snapshot size, a model input)."""
    from django.conf import settings
    from django.core.cache import cache

    from scheduler.models import Job, JobState

    ticks = 0
    while not stop.is_set():
        last = cache.get(settings.MONITORING_CYCLE_CACHE_KEY)
        if last:
            seen[last["at"]] = last["seconds"]
        if running is not None and ticks % 4 == 0:
            running.append(Job.objects.filter(state=JobState.RUNNING).count())
        ticks += 1
        stop.wait(0.5)


def merge_agents(reading: dict[str, float]) -> dict[str, float]:
    """One row for the simulated agents, whatever the number of processes they ran in."""
    out = {k: v for k, v in reading.items() if not k.startswith("agents")}
    out["simulated agents (all processes)"] = sum(
        v for k, v in reading.items() if k.startswith("agents")
    )
    return out


COMPONENTS = ("web (gunicorn)", "agent API pool", "Celery worker", "PostgreSQL", "Redis")
IDLE_SYNC_MAX_BYTES = 80  # an idle sync's body and its `unchanged` answer are ~60 bytes each


def request_class(method: str, path: str, answer_bytes: int, body_bytes: int) -> str:
    """The capacity model's class of one request, from gunicorn's access log line."""
    if path.startswith("/api/agent/"):
        if "/heartbeat" in path:
            return "heartbeat"
        if path.endswith("/sync"):
            # one with reports, or answered with the assignments in full, is busy
            idle = answer_bytes <= IDLE_SYNC_MAX_BYTES and body_bytes <= IDLE_SYNC_MAX_BYTES
            return "idle sync" if idle else "busy sync"
        if path.endswith("/logs"):
            return "log append"
        return "other agent request"
    if path.startswith("/metrics"):
        return "metrics"
    if path.startswith(("/healthz", "/readyz")):
        return "probe"
    if path.startswith("/events/"):
        return "event stream"
    if method == "POST" and path.startswith("/api/v1/jobs"):
        return "submit"
    return "page view"


LINE = re.compile(r'"(GET|POST|PUT|PATCH|DELETE|HEAD) (\S+) [^"]*" (\d+) (\d+|-) (\d+|-) (\d+)')


def served(log: Path, start: int, end: int) -> dict[str, list[float]]:
    """The requests gunicorn answered between two offsets of its access log
    (`bench.stack.ACCESS_LOG_FORMAT`), by the capacity model's class: each one's time in the
    worker (ms), so the count is the length."""
    out: dict[str, list[float]] = defaultdict(list)
    with log.open("rb") as f:
        f.seek(start)
        chunk = f.read(end - start).decode("utf-8", "replace")
    for line in chunk.splitlines():
        found = LINE.search(line)
        if not found:
            continue
        method, path, _status, answer, body, ms = found.groups()
        kind = request_class(
            method,
            path,
            int(answer) if answer.isdigit() else 0,
            int(body) if body.isdigit() else 0,
        )
        out[kind].append(float(ms))
    return out


def read_cost() -> dict[str, dict[str, float]] | None:
    """The costs per request `bench.endpoint_cost` last recorded in docs/benchmarks.md."""
    from bench import DOCS

    found = re.search(r"<!-- endpoint_cost:data (\{.*?\}) -->", DOCS.read_text(encoding="utf-8"))
    if not found:
        return None
    cost: dict[str, dict[str, float]] = json.loads(found.group(1))
    return cost


def read_cycle_cost() -> dict[str, dict[str, float]] | None:
    """The cycle's CPU terms `bench.cycle_cost` last recorded (fixed, per node, per
    allocation, per job placed; worker and PostgreSQL ms)."""
    from bench import DOCS

    found = re.search(r"<!-- cycle_cost:data (\{.*?\}) -->", DOCS.read_text(encoding="utf-8"))
    if not found:
        return None
    data: dict[str, dict[str, float]] = json.loads(found.group(1))
    return data


def read_meter(path: Path) -> dict[str, list[float]]:
    """The worker's task totals so far (`bench.worker_meter`; {} before the first task)."""
    try:
        data: dict[str, list[float]] = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data


def task_delta(
    before: dict[str, list[float]], after: dict[str, list[float]]
) -> dict[str, tuple[int, float]]:
    """(count, CPU s) of each task the worker ran between two `worker_meter` readings."""
    out = {}
    for name, (count, cpu) in after.items():
        c0, s0 = before.get(name, [0.0, 0.0])
        if count - c0 > 0:
            out[name] = (int(count - c0), cpu - s0)
    return out


def task_table(tasks: dict[str, tuple[int, float]], seconds: float, worker_cpu: float) -> str:
    rows = [
        [
            f"`{name}`",
            str(count),
            f"{count / seconds:.2f}",
            f"{cpu * 1000 / count:.1f}",
            f"{cpu:.1f}",
            f"{cpu / seconds:.3f}",
        ]
        for name, (count, cpu) in sorted(tasks.items(), key=lambda kv: -kv[1][1])
    ]
    total = sum(cpu for _, cpu in tasks.values())
    rows.append(["**all tasks**", "", "", "", f"{total:.1f}", f"{total / seconds:.3f}"])
    outside = worker_cpu - total
    rows.append(
        [
            "the worker outside its tasks (Celery's consumer: broker reads, acks, the timers "
            "of countdown tasks)",
            "",
            "",
            "",
            f"{outside:.1f}",
            f"{outside / seconds:.3f}",
        ]
    )
    return markdown_table(
        ["task", "runs", "per s", "CPU ms per run", "CPU s", "cores"],
        rows,
    )


# The worker's tasks besides the cycles that plan and the periodic ones (in the fleet at rest):
# each is priced per run from the last scaled run's meter, its rate counted in this one.
EVENT_TASKS = {
    "scheduler.job_notices": "job notices (a drain of the batches queued since the last one)",
    "scheduler.cycle (another was running)": "cycle requests that found the cycle running "
    "(retried after it, at most one waiting)",
    "scheduler.model_availability_refresh": "model availability (pages, at most every 5 s)",
}


def read_task_prices(section: str) -> dict[str, float] | None:
    """CPU ms per run of each event task, and per task message outside the tasks (key
    `outside`), from the worker meter of the last run recorded in `section`."""
    from bench import DOCS

    found = re.search(
        rf"<!-- bench:{section}:start -->.*?<!-- load:data (\{{.*?\}}) -->",
        DOCS.read_text(encoding="utf-8"),
        re.S,
    )
    if not found:
        return None
    data = json.loads(found.group(1))
    tasks = data.get("tasks")
    if not tasks:
        return None
    prices = {name: cpu * 1000 / count for name, (count, cpu) in tasks.items() if count}
    messages = sum(count for count, _ in tasks.values())
    prices["outside"] = data.get("outside", 0.0) * 1000 / max(1, messages)
    return prices


def read_worker_redis() -> dict[str, float] | None:
    """Redis CPU ms per Celery task message (`bench.worker_redis`): `notice` for a message
    alone (publish, fetch, unacked bookkeeping, ack), `cycle` for a scheduling cycle's (the
    same plus its single-flight lock)."""
    from bench import DOCS

    found = re.search(
        r"<!-- bench:worker_redis:start -->.*?<!-- worker_redis:data (\{.*?\}) -->",
        DOCS.read_text(encoding="utf-8"),
        re.S,
    )
    if not found:
        return None
    prices: dict[str, float] = json.loads(found.group(1))["ms_per_message"]
    return prices


def read_task_pg() -> dict[str, float] | None:
    """PostgreSQL CPU ms per run of the worker's event tasks (`bench.worker_task_pg`)."""
    from bench import DOCS

    found = re.search(
        r"<!-- bench:worker_task_pg:start -->.*?<!-- worker_task_pg:data (\{.*?\}) -->",
        DOCS.read_text(encoding="utf-8"),
        re.S,
    )
    if not found:
        return None
    prices: dict[str, float] = json.loads(found.group(1))["pg_ms"]
    return prices


def read_rest() -> dict[str, Any] | None:
    """What the fleet at rest costs besides its requests (`--users 0 --submit-rate 0
    --section load_rest`): the worker's periodic tasks, and the PostgreSQL and Redis work
    they do, per node."""
    from bench import DOCS

    text = DOCS.read_text(encoding="utf-8")
    section = re.search(
        r"<!-- bench:load_rest:start -->(.*?)<!-- bench:load_rest:end -->", text, re.S
    )
    if not section:
        return None
    found = re.search(r"<!-- load:data (\{.*?\}) -->", section.group(1))
    if not found:
        return None
    data: dict[str, Any] = json.loads(found.group(1))
    return data


def model_prediction(
    cost: dict[str, dict[str, float]],
    web: dict[str, list[float]],
    agent: dict[str, list[float]] | None,
    seconds: float,
    jobs_placed: int,
    nodes: int,
    rest: dict[str, Any] | None,
    cycles: tuple[int, float, dict[str, dict[str, float]]] | None = None,
    tasks: tuple[dict[str, tuple[int, float]], dict[str, float]] | None = None,
    broker: dict[str, float] | None = None,
    task_pg: dict[str, float] | None = None,
) -> tuple[dict[str, float], list[list[str]], list[str]]:
    """Cores the capacity model predicts for this run, per component: each class's rate as
    the pools served it (their access logs) times its CPU per request; the worker's as the
    jobs placed times the cycle's CPU per job. Returns the prediction per component, the
    table's rows (one per class and pool) and the classes served that the model has no
    cost for."""
    predicted: dict[str, float] = defaultdict(float)
    rows: list[list[str]] = []
    unpriced: list[str] = []
    pools = [("web pool", web)] + ([("agent API pool", agent)] if agent is not None else [])
    for pool, counts in pools:
        tier = "web (gunicorn)" if pool == "web pool" else "agent API pool"
        for name in sorted(counts, key=lambda k: -len(counts[k])):
            rate = len(counts[name]) / seconds
            price = cost.get(name)
            if price is None:
                unpriced.append(f"{name} ({pool}, {rate:.2f}/s)")
                continue
            predicted[tier] += rate * price["web_ms"] / 1000
            predicted["PostgreSQL"] += rate * price["pg_ms"] / 1000
            predicted["Redis"] += rate * price.get("redis_ms", 0.0) / 1000
            rows.append(
                [
                    f"{name} ({pool})",
                    f"{rate:.2f}",
                    f"{price['web_ms']:.1f}",
                    f"{price['pg_ms']:.1f}",
                    f"{price.get('redis_ms', 0.0):.1f}",
                ]
            )
    cycle = cost.get("cycle per job")
    if cycles is not None:  # the cycle by its snapshot (bench.cycle_cost)
        planned, running, terms = cycles
        rate, placed_rate = planned / seconds, jobs_placed / seconds
        for part, key in (("Celery worker", "cpu_ms"), ("PostgreSQL", "pg_ms")):
            t = terms[key]
            per_cycle = t["fixed"] + t["per node"] * nodes + t["per allocation"] * running
            predicted[part] += (rate * per_cycle + placed_rate * t["per job placed"]) / 1000
        t, p = terms["cpu_ms"], terms["pg_ms"]
        rows.append(
            [
                f"cycles that planned (Celery worker): fixed + per node × {nodes} + per "
                f"allocation × {running:.0f} running",
                f"{rate:.2f}",
                f"{t['fixed'] + t['per node'] * nodes + t['per allocation'] * running:.1f}",
                f"{p['fixed'] + p['per node'] * nodes + p['per allocation'] * running:.1f}",
                "–",
            ]
        )
        rows.append(
            [
                "jobs placed, per job (Celery worker)",
                f"{placed_rate:.2f}",
                f"{t['per job placed']:.1f}",
                f"{p['per job placed']:.1f}",
                "–",
            ]
        )
        if tasks is not None:  # the event tasks, and Celery's own work per task message
            counted, prices = tasks
            messages = 0
            for name, label in EVENT_TASKS.items():
                runs = counted.get(name, (0, 0.0))[0]
                messages += runs
                pg_ms = (task_pg or {}).get(name)
                if pg_ms is not None:
                    predicted["PostgreSQL"] += runs / seconds * pg_ms / 1000
                if name in prices:
                    predicted["Celery worker"] += runs / seconds * prices[name] / 1000
                    rows.append(
                        [
                            f"{label} (Celery worker)",
                            f"{runs / seconds:.2f}",
                            f"{prices[name]:.1f}",
                            "–" if pg_ms is None else f"{pg_ms:.1f}",
                            "–",
                        ]
                    )
            messages += planned
            predicted["Celery worker"] += messages / seconds * prices["outside"] / 1000
            rows.append(
                [
                    "Celery's consumer per task message above (Celery worker)",
                    f"{messages / seconds:.2f}",
                    f"{prices['outside']:.1f}",
                    "–",
                    "–",
                ]
            )
            if broker is not None:  # the worker's Redis: each message, each cycle's lock
                cycle_msgs = sum(
                    n for name, (n, _) in counted.items() if name.startswith("scheduler.cycle")
                )
                other_msgs = sum(
                    n for name, (n, _) in counted.items() if not name.startswith("scheduler.cycle")
                )
                for label, n, redis_ms in (
                    (
                        "cycle messages, all outcomes: broker + lock (Redis)",
                        cycle_msgs,
                        broker["cycle"],
                    ),
                    ("other task messages: broker (Redis)", other_msgs, broker["notice"]),
                ):
                    predicted["Redis"] += n / seconds * redis_ms / 1000
                    rows.append([label, f"{n / seconds:.2f}", "–", "–", f"{redis_ms:.2f}"])
    elif cycle is not None:
        rate = jobs_placed / seconds
        predicted["Celery worker"] += rate * cycle["web_ms"] / 1000
        predicted["PostgreSQL"] += rate * cycle["pg_ms"] / 1000
        rows.append(
            [
                "cycle per job placed (Celery worker)",
                f"{rate:.2f}",
                f"{cycle['web_ms']:.1f}",
                f"{cycle['pg_ms']:.1f}",
                "–",
            ]
        )
    if rest is not None:  # the fleet at rest: periodic tasks, per node
        per_node = {k: v / rest["nodes"] for k, v in rest["background"].items()}
        for part in ("Celery worker", "PostgreSQL", "Redis"):
            predicted[part] += per_node.get(part, 0.0) * nodes
        rows.append(
            [
                f"fleet at rest, per node × {nodes} (worker's periodic tasks; from the "
                f"`load_rest` section, {rest['nodes']} nodes)",
                "–",
                f"{per_node.get('Celery worker', 0.0) * 1000:.2f} ms/s",
                f"{per_node.get('PostgreSQL', 0.0) * 1000:.2f} ms/s",
                f"{per_node.get('Redis', 0.0) * 1000:.2f} ms/s",
            ]
        )
    return dict(predicted), rows, unpriced


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--submit-rate", type=float, default=50.0)
    parser.add_argument("--seconds", type=int, default=600)
    parser.add_argument("--web-workers", type=int, default=3)
    parser.add_argument("--port", type=int, default=8766)
    parser.add_argument("--agent-processes", type=int, default=4)
    parser.add_argument(
        "--agent-workers",
        type=int,
        default=2,
        help="the agent API pool's gunicorn workers (as deployed); 0: the web pool serves agents",
    )
    parser.add_argument("--agent-threads", type=int, default=4)
    parser.add_argument("--poll", type=float, default=None, help="agent poll interval (s)")
    parser.add_argument("--heartbeat", type=float, default=None, help="agent heartbeat (s)")
    parser.add_argument("--ramp", type=float, default=60.0, help="agents start over this long")
    parser.add_argument("--section", default="load", help="docs/benchmarks.md section to write")
    parser.add_argument(
        "--no-docs", action="store_true", help="only print (no docs/benchmarks.md section)"
    )
    args = parser.parse_args()
    # Redis of its own: its CPU time is then this run's alone (the machine's server is shared)
    redis_url, redis = private_redis()
    os.environ["REDIS_URL"] = redis_url
    try:
        run(args)
    finally:
        redis.terminate()
        redis.wait(timeout=30)


def run(args: argparse.Namespace) -> None:
    db_url = setup("load")
    dbname = db_url.rsplit("/", 1)[1]
    secret, tokens = seed(args.nodes, "")
    from portal.models import Membership, Project, Role, User

    project_id = Project.objects.get(slug="bench").pk
    users = []
    for n in range(args.users):  # one account and one session per simulated user
        email = f"user{n}@bench.example"
        user = User.objects.create_user(email, "bench-password-1")
        Membership.objects.create(
            project_id=project_id,
            user=user,
            role=Role.MEMBER,
        )
        users.append(email)
    teardown()
    stack = Stack(
        db_url,
        args.port,
        args.web_workers,
        "scheduler,default,telemetry,billing",
        agent_workers=args.agent_workers,
        agent_threads=args.agent_threads,
    )
    folder = Path(tempfile.mkdtemp(prefix="bench-load-"))
    access_log = folder / "access.log"
    agent_log = folder / "agent-access.log"
    stack.access_log = access_log
    stack.agent_access_log = agent_log if args.agent_workers else None
    meter = folder / "tasks.json"
    stack.task_meter = meter
    rec = Recorder()
    stop = threading.Event()
    try:
        stack.start()
        api = requests.Session()
        api.headers["Authorization"] = f"Bearer {secret}"
        sessions = [login(stack.url, email, "bench-password-1") for email in users]
        stack.swarm(
            tokens,
            args.agent_processes,
            poll_s=args.poll,
            heartbeat_s=args.heartbeat,
            ramp_s=args.ramp,
            stats=folder,
        )
        time.sleep(args.ramp + 10)  # every node registered and heard from
        cycles: dict[float, float] = {}
        running_seen: list[int] = []
        threads = [
            threading.Thread(
                target=browse,
                args=(rec, stack.url, sessions[i % len(sessions)], api, stop, random.Random(i)),
                daemon=True,
            )
            for i in range(args.users)
        ]
        threads.append(
            threading.Thread(
                target=submit, args=(rec, stack.url, api, args.submit_rate, stop), daemon=True
            )
        )
        threads.append(
            threading.Thread(target=watch_cycles, args=(stop, cycles, running_seen), daemon=True)
        )
        groups = {
            "web (gunicorn)": stack.procs[0].pid,
            "Celery worker": stack.procs[1].pid,
            "Celery beat": stack.procs[2].pid,
            **({"agent API pool": stack.agent_pool.pid} if stack.agent_pool else {}),
            **{f"agents, process {k + 1}": p.pid for k, p in enumerate(stack.swarms)},
        }
        from scheduler.models import JobEvent as Event

        events_before = Event.objects.filter(to_state="scheduled").count()
        redis_pids = {redis_pid()}
        backends = database_backends(dbname)
        pg = BackendsCpu(dbname)
        pg.start()
        cpu_before = cpu_seconds(groups, backends, redis_pids)
        tasks_before = read_meter(meter)
        log_window = [access_log.stat().st_size, 0]
        agent_window = [agent_log.stat().st_size if args.agent_workers else 0, 0]
        (folder / "mark").touch()  # the agents' measured window starts
        load_at_start = os.getloadavg()
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        backends |= database_backends(dbname)
        cpu_after = cpu_seconds(groups, backends, redis_pids)
        tasks_after = read_meter(meter)
        # this database's backends, sampled through the window (see BackendsCpu)
        pg_used = pg.finish()
        cpu_before["PostgreSQL"] = 0.0
        cpu_after["PostgreSQL"] = pg_used
        log_window[1] = access_log.stat().st_size
        agent_window[1] = agent_log.stat().st_size if args.agent_workers else 0
        load_at_end = os.getloadavg()
        placed = Event.objects.filter(to_state="scheduled").count() - events_before
        stop.set()
        for t in threads:
            t.join(timeout=35)
    finally:
        stack.stop()
    # Invariants and the last cycle's duration, read after the run.
    from django.conf import settings

    from scheduler.models import Job, JobEvent, NodeEvent
    from tests.hardening.invariants import assert_invariants

    durations = sorted(cycles.values()) or [float("nan")]
    ok = "held"
    try:
        assert_invariants()
    except AssertionError as exc:
        ok = f"BROKEN: {exc}"
    submitted = Job.objects.count()
    lost = NodeEvent.objects.filter(kind="node_lost").values("node").distinct().count()
    seconds = float(args.seconds)
    cpu_rows = cpu_table(merge_agents(cpu_before), merge_agents(cpu_after), seconds=seconds)
    cpu_table_md = markdown_table(["part", "CPU s", "cores used (CPU s / wall s)"], cpu_rows)
    running = JobEvent.objects.filter(to_state="running").values("job").distinct().count()
    web_served = served(access_log, *log_window)
    agent_served = served(agent_log, *agent_window) if args.agent_workers else None
    swarm = swarm_stats(folder)
    table = latency_table(rec, web_served, agent_served, swarm)
    gaps = heartbeat_gaps(swarm, float(settings.NODE_LOST_AFTER_SECONDS))
    summary = (
        f"Scale run: {args.users} users, {args.nodes} nodes × 8 GPUs, {args.submit_rate:g} "
        f"submits/s for {args.seconds} s ({submitted} jobs submitted, {running} of them reached "
        f"running; **{lost} nodes were declared lost** at some point); scheduling cycle over "
        f"{len(cycles)} cycles seen: median {statistics.median(durations):.2f} s, p95 "
        f"{durations[int(0.95 * (len(durations) - 1))]:.2f} s, max {durations[-1]:.2f} s; "
        f"invariants at the end: **{ok}**. Load average (1 / 5 / 15 min) when the measured "
        f"window began {fmt_load(load_at_start)}, when it ended {fmt_load(load_at_end)}."
    )
    tasks = task_delta(tasks_before, tasks_after)
    worker_cpu = cpu_after.get("Celery worker", 0.0) - cpu_before.get("Celery worker", 0.0)
    tasks_md = task_table(tasks, seconds, worker_cpu)
    planned = tasks.get("scheduler.cycle (planned)", (0, 0.0))[0]
    mean_running = statistics.mean(running_seen) if running_seen else 0.0
    terms = read_cycle_cost()
    prices = None if args.users == 0 else read_task_prices(args.section)
    cost = read_cost()
    model_md = ""
    data: dict[str, Any] = {"nodes": args.nodes, "seconds": seconds}
    if cost is not None:
        at_rest = args.users == 0 and args.submit_rate == 0
        predicted, model_rows, unpriced = model_prediction(
            cost,
            web_served,
            agent_served,
            seconds,
            placed,
            args.nodes,
            None if at_rest else read_rest(),
            None if terms is None else (planned, mean_running, terms),
            None if prices is None else (tasks, prices),
            read_worker_redis(),
            read_task_pg(),
        )
        model_md = "\n\n" + model_comparison(
            predicted, model_rows, unpriced, cpu_before, cpu_after, seconds
        )
        measured = {k: (cpu_after[k] - cpu_before.get(k, 0.0)) / seconds for k in cpu_after}
        data["measured"] = {k: measured.get(k, 0.0) for k in COMPONENTS}
        data["predicted"] = {k: predicted.get(k, 0.0) for k in COMPONENTS}
        # what requests do not explain: the worker's periodic tasks and their statements
        data["background"] = {
            k: max(0.0, data["measured"][k] - data["predicted"][k])
            for k in ("Celery worker", "PostgreSQL", "Redis")
        }
        data["tasks"] = {name: list(v) for name, v in sorted(tasks.items())}
        data["outside"] = worker_cpu - sum(cpu for _, cpu in tasks.values())  # CPU s
        model_md += "\n\n<!-- load:data " + json.dumps(data, sort_keys=True) + " -->"
    print(table)
    print(cpu_table_md)
    print(tasks_md)
    print(summary)
    print(gaps)
    print(model_md)
    if args.no_docs:
        return
    pools = (
        f"gunicorn for pages and the public API ({args.web_workers} workers × 4 threads) and, as "
        f"deployed, the agent API pool of its own (`config.wsgi_agent`, {args.agent_workers} "
        f"workers × {args.agent_threads} threads), which the agents talk to"
        if args.agent_workers
        else f"one gunicorn ({args.web_workers} workers × 4 threads) serving users and agents"
    )
    write_section(
        args.section,
        f"## Load: users, nodes and submissions together ({args.users} users, {args.nodes} nodes, "
        f"{args.submit_rate:g} submits/s)\n\n"
        f"`{command_line('bench.load')}` — {pools}; one Celery worker, beat, PostgreSQL (this run's database; its "
        "backends' CPU sampled every 0.5 s) and a Redis server of the run's own, all on this "
        "machine; the real agent code runs the simulated nodes in "
        f"{args.agent_processes} processes (poll {args.poll or 'default'} s, heartbeat "
        f"{args.heartbeat or 'default'} s, started over {args.ramp:g} s), and the users and "
        "the submitter are threads of the benchmark's own process. Errors are 5xx answers and "
        "requests unanswered after 30 s (users) or 10 s (agents). Latency *seen* is the "
        "client's (users, submitter, agents: queueing in front of the server included); "
        "*in the worker* is gunicorn's own time for the request (its access log).\n\n"
        + table
        + "\n\nWhere the cores went during the measured window:\n\n"
        + cpu_table_md
        + "\n\nThe Celery worker's CPU by task over the same window (each task's thread CPU "
        "time, `bench.worker_meter`; a cycle *planned* when it read the snapshot; running "
        f"jobs sampled every 2 s: mean {mean_running:.0f}):\n\n"
        + tasks_md
        + "\n\n"
        + summary
        + "\n\n"
        + gaps
        + model_md,
    )


class BackendsCpu:
    """CPU seconds the PostgreSQL backends of one database used over a window, sampled every
    half second: Django's persistent connections end after DB_CONN_MAX_AGE and their
    successors start, and a backend's CPU time leaves /proc with it, so two readings at the
    window's ends would miss most of it. Each backend counts from its first sample (from 0 if
    it started in the window) to its last; what one uses after its last sample is missed."""

    def __init__(self, dbname: str) -> None:
        self.dbname = dbname
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, initial: bool) -> None:
        from bench.endpoint_cost import proc_cpu

        for pid in database_backends(self.dbname):
            try:
                used = proc_cpu(pid)
            except OSError:
                continue
            self.first.setdefault(pid, used if initial else 0.0)
            self.last[pid] = used

    def _run(self) -> None:
        while not self.stop.wait(0.5):
            self._sample(False)

    def start(self) -> None:
        self._sample(True)
        self.thread.start()

    def finish(self) -> float:
        self._sample(False)
        self.stop.set()
        self.thread.join(timeout=5)
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


def redis_pid() -> int:
    """The pid of the Redis server REDIS_URL names (this run's own)."""
    import redis as redis_client

    info = redis_client.Redis.from_url(os.environ["REDIS_URL"]).info("server")
    return int(info["process_id"])


def fmt_load(values: tuple[float, float, float]) -> str:
    return " / ".join(f"{v:.1f}" for v in values)


def swarm_stats(folder: Path) -> dict[str, Any]:
    """The agent processes' timings (`bench.agent_swarm --stats`), merged."""
    merged: dict[str, Any] = {"latency": defaultdict(list), "failed": defaultdict(int), "nodes": {}}
    for path in sorted(folder.glob("swarm-*.json")):
        part = json.loads(path.read_text(encoding="utf-8"))
        for kind, values in part["latency"].items():
            merged["latency"][kind] += values
        for kind, n in part["failed"].items():
            merged["failed"][kind] += n
        merged["nodes"].update(part["nodes"])
        merged["interval_s"] = part["interval_s"]
    return merged


def latency_table(
    rec: Recorder,
    web: dict[str, list[float]],
    agent: dict[str, list[float]] | None,
    swarm: dict[str, Any],
) -> str:
    """p50/p95/p99 per endpoint (users, submitter) and per agent request class, as seen by the
    client, beside the time the serving worker took (ms, gunicorn's access log)."""
    rows = []
    users_class = {
        "GET / (dashboard)": "page view",
        "GET /api/v1/jobs": "page view",
        "GET /jobs/ (htmx list)": "page view",
        "GET job chart series": "page view",
        "POST /api/v1/jobs": "submit",
    }

    def worker(values: list[float]) -> str:
        if not values:
            return "–"
        return f"{statistics.median(values):.0f} / {pct([v / 1000 for v in values], 0.95):.0f}"

    for name in sorted(rec.latency):
        values = rec.latency[name]
        total = len(values) + rec.unanswered[name]
        rows.append(
            [
                name,
                str(total),
                f"{100 * rec.errors[name] / max(1, total):.2f}%",
                str(rec.throttled[name]),
                f"{statistics.median(values) * 1000:.0f}",
                f"{pct(values, 0.95):.0f}",
                f"{pct(values, 0.99):.0f}",
                f"{worker(web.get(users_class.get(name, ''), []))} (class: "
                f"{users_class.get(name, '?')})",
            ]
        )
    served_agents = agent if agent is not None else web
    for kind in ("heartbeat", "idle sync", "busy sync", "log append", "other agent request"):
        values = swarm["latency"].get(kind, [])
        failed = swarm["failed"].get(kind, 0) + (
            swarm["failed"].get("sync (no answer)", 0) if kind == "busy sync" else 0
        )
        if not values and not failed:
            continue
        total = len(values) + failed
        rows.append(
            [
                f"agent: {kind}",
                str(total),
                f"{100 * failed / max(1, total):.2f}%",
                "–",
                f"{statistics.median(values) * 1000:.0f}" if values else "–",
                f"{pct(values, 0.95):.0f}" if values else "–",
                f"{pct(values, 0.99):.0f}" if values else "–",
                worker(served_agents.get(kind, [])),
            ]
        )
    return markdown_table(
        [
            "endpoint",
            "requests",
            "errors",
            "429",
            "p50 ms seen",
            "p95 ms seen",
            "p99 ms seen",
            "p50 / p95 ms in the worker",
        ],
        rows,
    ) + (
        "\n\n(A sync whose answer never came is counted as a busy sync's error: what it "
        "carried is not known.)"
        if swarm["failed"].get("sync (no answer)")
        else ""
    )


def heartbeat_gaps(swarm: dict[str, Any], lost_after: float) -> str:
    """Each node's longest silence as the portal saw it (between two answered heartbeats),
    and what filled it: waiting on the portal, or the agent's own loop."""
    nodes = swarm.get("nodes") or {}
    if not nodes:
        return "Heartbeat gaps: no agent timings were recorded."
    interval = float(swarm.get("interval_s") or 0)
    gaps = sorted(v["max_gap_s"] for v in nodes.values())
    worst_name = max(nodes, key=lambda n: nodes[n]["max_gap_s"])
    worst = nodes[worst_name]
    near = sum(1 for g in gaps if g >= lost_after / 2)
    return (
        f"Heartbeats (agents' side, {len(nodes)} nodes, interval {interval:g} s, a node is "
        f"declared lost after {lost_after:g} s of silence): each node's longest gap between "
        f"two answered heartbeats, median {statistics.median(gaps):.1f} s, max "
        f"{gaps[-1]:.1f} s ({worst_name}: {worst['waiting_on_portal_s']:.1f} s of it waiting "
        f"on the portal's answers, {max(0.0, worst['max_gap_s'] - worst['waiting_on_portal_s']):.1f} s "
        f"in the agent's own loop); {near} nodes had a gap of half the loss limit or more."
    )


def model_comparison(
    predicted: dict[str, float],
    rows: list[list[str]],
    unpriced: list[str],
    before: dict[str, float],
    after: dict[str, float],
    seconds: float,
) -> str:
    """The capacity model's cores per component beside the measured ones."""
    measured = {name: (after[name] - before.get(name, 0.0)) / seconds for name in after}
    lines = []
    for part in COMPONENTS:
        if part not in measured:
            continue
        want = predicted.get(part, 0.0)
        got = measured[part]
        ratio = got / want if want > 0 else float("nan")
        verdict = "within 25%" if abs(ratio - 1) <= 0.25 else "outside 25%"
        lines.append([part, f"{want:.3f}", f"{got:.3f}", f"{ratio:.2f}", verdict])
    body = (
        "The capacity model (docs/capacity.md) against this run, per component: predicted "
        "cores = Σ requests/s (as the pools' access logs counted them) × CPU per request "
        "(`bench.endpoint_cost`); for the worker, the cycles that planned × their cost by "
        "snapshot and the jobs placed × their own (`bench.cycle_cost`), the event tasks as "
        "the worker meter counted them × their CPU per run in the previous scaled run, and "
        "Celery's consumer per task message; the worker's Redis, each task message × its "
        "broker cost and each cycle's × broker and lock (`bench.worker_redis`); the notice and "
        "availability tasks' PostgreSQL per run (`bench.worker_task_pg`); measured = the "
        "component's CPU seconds over "
        "the window (from /proc).\n\n"
        + markdown_table(
            ["component", "predicted cores", "measured cores", "measured / predicted", ""],
            lines,
        )
        + "\n\n"
        + markdown_table(
            [
                "class (where served)",
                "requests/s",
                "CPU ms/request",
                "PostgreSQL ms",
                "Redis ms",
            ],
            rows,
        )
    )
    if unpriced:
        body += "\n\nServed but without a cost in the model: " + ", ".join(unpriced) + "."
    return body


if __name__ == "__main__":
    main()
