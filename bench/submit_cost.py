"""The work of one API submit, in one process: CPU time, SQL statements, and a profile.

    .venv/bin/python -m bench.submit_cost [--requests 200] [--runs 5] [--profile FILE]
    .venv/bin/python -m bench.submit_cost --only N   # under valgrind: N submits, nothing else

`POST /api/v1/jobs` (one GPU, admitted and queued; no cycle runs) goes through Django's WSGI
handler in this process: every middleware, DRF's authentication, throttles and parsing,
validation, admission, the job row, its events, the audit event and the push publish, on
PostgreSQL and Redis, with persistent database connections as in production. What an HTTP
server adds (gunicorn's parsing, the socket) is left out, so the figure is the portal's own
work per submit, and the client costs nothing that is counted: the CPU time is this process's
(`time.process_time`) during the submits, PostgreSQL's is its backend's (from /proc).

CPU time still moves with what else the machine runs; instruction counts do not. For those:

    valgrind --tool=callgrind --instr-atstart=no .venv/bin/python -m bench.submit_cost \
        --reuse --only 20 --callgrind

counts the instructions of 20 submits only (after the warm-up; `callgrind_control` switches the
instrumentation on and off around them; `--reuse` takes the database of an earlier plain run,
so nothing is migrated under valgrind). Divide callgrind's "Collected" by 20. The measured
submits find a cycle already requested and their token's use recorded (`steady_state`), as in
a stream of submits, so that how long each takes changes nothing they do. `--profile FILE` writes a
cProfile of the measured submits (read with `python -m pstats FILE`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from typing import Any

from bench import command_line, machine, markdown_table, spread, wsgi_environ


def _environ(secret: str, body: bytes) -> dict[str, Any]:
    return wsgi_environ("POST", "/api/v1/jobs", body, {"Authorization": f"Bearer {secret}"})


class Submitter:
    """Sends submits through the WSGI application and checks each answer."""

    def __init__(self, secret: str) -> None:
        from django.core.handlers.wsgi import WSGIHandler

        self.app = WSGIHandler()
        self.secret = secret
        self.n = 0

    def __call__(self) -> None:
        self.n += 1
        body = json.dumps(
            {
                "project": "bench",
                "name": f"c{self.n}",
                "command": "sleep 3600",
                "gpu_model": "H100-80GB-SXM",
            }
        ).encode()
        status: list[str] = []
        result = self.app(_environ(self.secret, body), lambda s, h, exc=None: status.append(s))
        answer = b"".join(result)
        result.close()  # request_finished: the connection is kept (CONN_MAX_AGE), as in gunicorn
        if not status[0].startswith("201") or json.loads(answer)["state"] != "queued":
            raise SystemExit(f"submit answered {status[0]}: {answer[:300]!r}")


def backend_cpu() -> tuple[int, float]:
    """This process's PostgreSQL backend and its CPU seconds so far (0 on a remote server)."""
    from django.db import connection

    from bench.endpoint_cost import proc_cpu

    with connection.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
    try:
        return pid, proc_cpu(pid)
    except OSError:
        return pid, 0.0


def callgrind_instrumentation(state: str) -> None:
    """Switch callgrind's instrumentation of this process on or off (`callgrind_control`,
    run beside it; this process keeps running Python meanwhile, which callgrind needs to see
    the command)."""
    control = subprocess.Popen(
        ["callgrind_control", "--instr=" + state, str(os.getpid())], stdout=subprocess.DEVNULL
    )
    spin = 0
    while control.poll() is None:
        spin += sum(range(1000))
    if control.returncode != 0:
        raise SystemExit("callgrind_control failed: run under valgrind --tool=callgrind")


def steady_state() -> None:
    """What a stream of submits finds, made independent of how long a submit takes (valgrind
    slows it fifty-fold): a cycle already requested, so no submit enqueues one (requests
    coalesce for 5 s), and the token's last use recent, so none records it (once a minute)."""
    from datetime import timedelta

    from django.core.cache import cache
    from django.utils import timezone

    from portal.models import ApiToken
    from scheduler.cycle_requests import CYCLE_REQUESTED

    cache.set(CYCLE_REQUESTED, 1, timeout=3600)
    ApiToken.objects.update(last_used_at=timezone.now() + timedelta(days=1))


def reuse(db_suffix: str) -> str | None:
    """Point Django at the database an earlier run made and seeded, empty its jobs, and
    return a new token for the bench user; None if there is no such database."""
    from bench.django_env import reuse as reuse_database

    if not reuse_database(db_suffix):
        return None
    from django.db import connection

    from portal.models import User
    from portal.services import token_create

    user = User.objects.filter(email="bench@example.org").first()
    if user is None:
        return None
    with connection.cursor() as cur:  # the queue as a fresh run finds it
        cur.execute("TRUNCATE scheduler_job CASCADE")
    return token_create(user=user, name="bench").secret


def statements_per_submit(submit: Submitter, show: bool = False) -> int:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        submit()
    if show:
        for query in ctx.captured_queries:
            print(query["sql"][:400])
    return len(ctx.captured_queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200, help="submits per run")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--profile", help="write a cProfile of the measured submits here")
    parser.add_argument(
        "--only", type=int, help="set up, warm up, then send this many submits and exit"
    )
    parser.add_argument("--db-suffix", default="subcost")
    parser.add_argument(
        "--callgrind",
        action="store_true",
        help="with --only, under valgrind --tool=callgrind --instr-atstart=no: count only the "
        "submits",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="reuse the database an earlier run made (no migrations: quick under valgrind)",
    )
    parser.add_argument("--show-sql", action="store_true", help="print one submit's statements")
    args = parser.parse_args()
    os.environ.setdefault("DB_CONN_MAX_AGE", "60")
    # One user submits all: the per-user rate limits must not be what is measured.
    os.environ.setdefault("RATE_SUBMIT", "60000000/min")
    os.environ.setdefault("RATE_USER", "60000000/min")
    host = machine() if args.only is None else ""

    from bench.django_env import setup, teardown

    secret = reuse(args.db_suffix) if args.reuse else None
    if secret is None:
        setup(args.db_suffix)
        from bench.submit_throughput import seed

        secret, _tokens = seed(5, "")
    teardown()
    submit = Submitter(secret)
    for _ in range(args.warmup):
        submit()
    steady_state()
    if args.only is not None:
        if args.callgrind:
            callgrind_instrumentation("on")
        for _ in range(args.only):
            submit()
        if args.callgrind:
            callgrind_instrumentation("off")
        teardown()
        return
    statements = statements_per_submit(submit, args.show_sql)
    cpu: list[float] = []
    pg: list[float] = []
    wall: list[float] = []
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile(time.process_time)
    for run in range(args.runs):
        (pid0, pg0), c0, w0 = backend_cpu(), time.process_time(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        for _ in range(args.requests):
            submit()
        if profiler is not None:
            profiler.disable()
        c1, w1 = time.process_time(), time.perf_counter()
        pid1, pg1 = backend_cpu()
        cpu.append((c1 - c0) / args.requests * 1000)
        wall.append((w1 - w0) / args.requests * 1000)
        if pid1 == pid0:  # else the connection was renewed (CONN_MAX_AGE) and took its count
            pg.append((pg1 - pg0) / args.requests * 1000)
        print(f"run {run + 1}: {cpu[-1]:.2f} ms CPU", flush=True)
    teardown()
    if profiler is not None:
        profiler.dump_stats(args.profile)
    portal = statistics.median(cpu)
    both = portal + (statistics.median(pg) if pg else 0.0)
    print(f"`{command_line('bench.submit_cost')}`\n")
    print(
        markdown_table(
            [
                "portal CPU ms/submit",
                "PostgreSQL CPU ms/submit",
                "wall ms/submit",
                "SQL statements",
                "submits/s per core (portal + PostgreSQL)",
            ],
            [
                [
                    spread(cpu, 2),
                    spread(pg, 2),
                    spread(wall, 2),
                    str(statements),
                    f"{1000 / both:.0f}" if both else "–",
                ]
            ],
        )
    )
    print(f"\n(portal alone: {1000 / portal:.0f} submits/s per core)\n")
    print(host)


if __name__ == "__main__":
    main()
