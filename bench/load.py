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
import random
import re
import statistics
import tempfile
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

from bench import command_line, markdown_table, write_section
from bench.django_env import setup, teardown
from bench.stack import Stack, cpu_seconds, cpu_table
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


def watch_cycles(stop: threading.Event, seen: dict[float, float]) -> None:
    """Every cycle's duration, read from what the cycle task publishes (its `at` is the key)."""
    from django.conf import settings
    from django.core.cache import cache

    while not stop.is_set():
        last = cache.get(settings.MONITORING_CYCLE_CACHE_KEY)
        if last:
            seen[last["at"]] = last["seconds"]
        stop.wait(0.5)


def merge_agents(reading: dict[str, float]) -> dict[str, float]:
    """One row for the simulated agents, whatever the number of processes they ran in."""
    out = {k: v for k, v in reading.items() if not k.startswith("agents")}
    out["simulated agents (all processes)"] = sum(
        v for k, v in reading.items() if k.startswith("agents")
    )
    return out


def served(log: Path, start: int, end: int) -> dict[str, int]:
    """Requests gunicorn answered between two offsets of its access log, by the capacity
    model's class (other agent requests count as syncs, other pages as page views)."""
    counts: dict[str, int] = defaultdict(int)
    with log.open("rb") as f:
        f.seek(start)
        chunk = f.read(end - start).decode("utf-8", "replace")
    for line in chunk.splitlines():
        found = re.search(r'"(GET|POST|PUT|PATCH|DELETE|HEAD) (\S+)', line)
        if not found:
            continue
        method, path = found.groups()
        if path.startswith("/api/agent/"):
            counts["heartbeat" if "/heartbeat" in path else "sync"] += 1
        elif path.startswith("/metrics"):
            counts["metrics"] += 1
        elif method == "POST" and path.startswith("/api/v1/jobs"):
            counts["submit"] += 1
        else:
            counts["page view"] += 1
    return counts


def model_prediction(
    counts: dict[str, int], seconds: float
) -> tuple[float, list[list[str]]] | None:
    """Web cores the capacity model predicts for this run: each class's rate, as gunicorn
    served it, times its web CPU per request as `bench.endpoint_cost` last recorded it in
    docs/benchmarks.md. None when there is no such record."""
    from bench import DOCS

    found = re.search(r"<!-- endpoint_cost:data (\{.*?\}) -->", DOCS.read_text(encoding="utf-8"))
    if not found:
        return None
    cost = json.loads(found.group(1))
    rates = {name: counts.get(name, 0) / seconds for name in cost}
    rows, total = [], 0.0
    for name in ("page view", "submit", "sync", "heartbeat"):
        cores = rates[name] * cost[name]["web_ms"] / 1000
        total += cores
        rows.append([name, f"{rates[name]:.1f}", f"{cost[name]['web_ms']:.1f}", f"{cores:.2f}"])
    return total, rows


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
    parser.add_argument("--poll", type=float, default=None, help="agent poll interval (s)")
    parser.add_argument("--heartbeat", type=float, default=None, help="agent heartbeat (s)")
    parser.add_argument("--ramp", type=float, default=60.0, help="agents start over this long")
    parser.add_argument("--section", default="load", help="docs/benchmarks.md section to write")
    parser.add_argument(
        "--no-docs", action="store_true", help="only print (no docs/benchmarks.md section)"
    )
    args = parser.parse_args()
    db_url = setup("load")
    secret, tokens = seed(args.nodes, "")
    from portal.models import Membership, Role, User

    users = []
    for n in range(args.users):  # one account and one session per simulated user
        email = f"user{n}@bench.example"
        user = User.objects.create_user(email, "bench-password-1")
        Membership.objects.create(
            project_id=User.objects.get(email="bench@example.org").projects.first().pk,
            user=user,
            role=Role.MEMBER,
        )
        users.append(email)
    teardown()
    stack = Stack(db_url, args.port, args.web_workers, "scheduler,default,telemetry,billing")
    access_log = Path(tempfile.mkdtemp(prefix="bench-load-")) / "access.log"
    stack.access_log = access_log
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
        )
        time.sleep(args.ramp + 10)  # every node registered and heard from
        cycles: dict[float, float] = {}
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
        threads.append(threading.Thread(target=watch_cycles, args=(stop, cycles), daemon=True))
        groups = {
            "web (gunicorn)": stack.procs[0].pid,
            "Celery worker": stack.procs[1].pid,
            "Celery beat": stack.procs[2].pid,
            **{f"agents, process {k + 1}": p.pid for k, p in enumerate(stack.swarms)},
        }
        cpu_before = cpu_seconds(groups)
        log_window = [access_log.stat().st_size, 0]
        for t in threads:
            t.start()
        time.sleep(args.seconds)
        cpu_after = cpu_seconds(groups)
        log_window[1] = access_log.stat().st_size
        stop.set()
        for t in threads:
            t.join(timeout=35)
    finally:
        stack.stop()
    # Invariants and the last cycle's duration, read after the run.
    from scheduler.models import Job, JobEvent
    from tests.hardening.invariants import assert_invariants

    durations = sorted(cycles.values()) or [float("nan")]
    ok = "held"
    try:
        assert_invariants()
    except AssertionError as exc:
        ok = f"BROKEN: {exc}"
    submitted = Job.objects.count()
    from scheduler.models import NodeEvent

    lost = NodeEvent.objects.filter(kind="node_lost").values("node").distinct().count()
    cpu_rows = cpu_table(
        merge_agents(cpu_before), merge_agents(cpu_after), seconds=float(args.seconds)
    )
    cpu_table_md = markdown_table(["part", "CPU s", "cores used (CPU s / wall s)"], cpu_rows)
    running = JobEvent.objects.filter(to_state="running").values("job").distinct().count()
    rows = []
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
            ]
        )
    table = markdown_table(
        ["endpoint", "requests", "errors", "429", "p50 ms", "p95 ms", "p99 ms"], rows
    )
    summary = (
        f"Scale run: {args.users} users, {args.nodes} nodes × 8 GPUs, {args.submit_rate:g} submits/s "
        f"for {args.seconds} s ({submitted} jobs submitted, {running} of them reached "
        f"running; {lost} nodes were declared lost at some point); scheduling cycle over {len(cycles)} cycles seen: median "
        f"{statistics.median(durations):.2f} s, p95 {durations[int(0.95 * (len(durations) - 1))]:.2f} s, "
        f"max {durations[-1]:.2f} s; invariants at the end: **{ok}**."
    )
    predicted = model_prediction(served(access_log, *log_window), float(args.seconds))
    model_md = ""
    if predicted is not None:
        web_used = cpu_after["web (gunicorn)"] - cpu_before["web (gunicorn)"]
        measured = web_used / args.seconds
        total, model_rows = predicted
        model_rows.append(["**predicted web cores**", "", "", f"**{total:.2f}**"])
        model_rows.append(["**measured web cores**", "", "", f"**{measured:.2f}**"])
        model_md = (
            "\n\nThe capacity model (docs/capacity.md) against this run, web tier: "
            f"measured / predicted = **{measured / total:.2f}** "
            f"({'within' if abs(measured / total - 1) <= 0.25 else 'outside'} 25%).\n\n"
            + markdown_table(
                ["class", "requests/s", "web CPU ms/request (bench.endpoint_cost)", "cores"],
                model_rows,
            )
        )
    print(table)
    print(cpu_table_md)
    print(summary)
    print(model_md)
    if args.no_docs:
        return
    write_section(
        args.section,
        f"## Load: users, nodes and submissions together ({args.users} users, {args.nodes} nodes, "
        f"{args.submit_rate:g} submits/s)\n\n"
        f"`{command_line('bench.load')}` — gunicorn ({args.web_workers} workers × 4 threads), one "
        "Celery worker, beat, PostgreSQL and Redis on this 2-core machine; the real agent code "
        f"runs the simulated nodes in {args.agent_processes} processes (poll "
        f"{args.poll or 'default'} s, heartbeat {args.heartbeat or 'default'} s, started over "
        f"{args.ramp:g} s), and the users and the submitter are threads of the benchmark's own "
        "process, all on the same two cores. Errors are 5xx answers and requests unanswered "
        "after 30 s.\n\n" + table + "\n\nWhere the two cores went during the measured "
        "window:\n\n" + cpu_table_md + "\n\n" + summary + model_md,
    )


if __name__ == "__main__":
    main()
