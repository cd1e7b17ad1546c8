"""Requests and server CPU per open page per minute: pages polled (before) vs pushed (after).

One uvicorn server (`config.asgi`, as `make run` with Redis and the events service run it) on a
bench database; a job running on a node whose agent heartbeats every 10 s (the agent's
default; in-process ingest here, so the server's CPU is the pages' alone), one log line every
5 s. Headless Chromium keeps `--pages` tabs of the job page open for `--seconds`, first with
push off (`PUSH_ENABLED=false`: the stream answers 204 and the page polls, as every page did
before) and then on, alternating `--rounds` times. Counted: the page's requests after it
loaded (Chromium's own count), and the server process's CPU seconds (/proc), per page and minute.

    .venv/bin/python -m bench.push_pages --pages 4 --seconds 60 --rounds 2 --write-docs
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from bench import REPO, command_line, machine, markdown_table, write_section


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scene() -> tuple[object, object, object, str]:
    """A running job on a node, and its member's login."""
    from django.core.management import call_command

    from portal.models import Membership, Project, Role, User
    from scheduler.cycle import run_cycle
    from scheduler.models import Allocation, Job, JobState
    from scheduler.transitions import job_transition

    call_command("seed_demo", verbosity=0)
    user = User.objects.get(email="researcher@gpucloud.example")
    project = Project.objects.filter(memberships__user=user, memberships__role=Role.OWNER).first()
    assert project is not None and Membership.objects.filter(project=project, user=user).exists()
    from django.conf import settings
    from rest_framework.test import APIClient

    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "testserver"]
    client = APIClient()
    client.force_authenticate(user)
    resp = client.post(
        "/api/v1/jobs",
        {"project": project.slug, "name": "bench", "command": "true", "gpus": 1},
        format="json",
    )
    assert resp.status_code == 201, resp.content
    from django.utils import timezone

    from scheduler.models import Node

    Node.objects.update(state="ready", last_heartbeat_at=timezone.now())  # agents have spoken
    run_cycle()
    job = Job.objects.get(pk=resp.json()["id"])
    job_transition(job=job, to=JobState.RUNNING, reason="bench")
    alloc = Allocation.objects.filter(job=job).select_related("node").first()
    assert alloc is not None
    return job, alloc, user, "researcher-demo-pass"


def _driver(job, alloc, stop: threading.Event) -> None:
    """The node's agent, in-process: a heartbeat every 10 s, a log line every 5 s."""
    from django.db import connection
    from django.utils import timezone

    from monitoring.ingest import ingest_samples
    from scheduler.nodes.reports import job_log_append

    seq, tick = 0, 0
    while not stop.wait(5):
        seq += 1
        job_log_append(
            node=alloc.node,
            job_id=job.pk,
            attempt=alloc.attempt,
            seq=seq + 10**6 * tick,
            stream="stdout",
            text=f"step {seq}\n",
        )
        if seq % 2 == 0:
            sample = {
                "gpu_id": alloc.gpu_id,
                "utilization": 40.0 + seq % 50,
                "memory_used_mib": 900,
            }
            ingest_samples(node=alloc.node, samples=[sample], now=timezone.now())
    connection.close()


def _measure(
    base: str, pid: int, job_id: int, email: str, password: str, pages: int, seconds: float
) -> tuple[float, float]:
    from playwright.sync_api import sync_playwright

    chromium = os.environ.get("CHROMIUM_PATH") or shutil.which("chromium")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium, headless=True, args=["--no-sandbox", "--disable-gpu"]
        )
        context = browser.new_context(base_url=base)
        login = context.new_page()
        login.goto("/login/")
        login.fill("#id_username", email)
        login.fill("#id_password", password)
        login.click("button[type=submit]")
        login.wait_for_load_state("networkidle")
        login.close()
        tabs = []
        counts = [0]
        for _ in range(pages):
            tab = context.new_page()
            tab.goto(f"/jobs/{job_id}/")
            tab.wait_for_load_state("load")
            tabs.append(tab)
        time.sleep(5)  # past the page's own load requests (and the stream's first refresh)
        kinds: Counter[str] = Counter()

        def seen(request: object) -> None:
            counts[0] += 1
            url = request.url.split("?")[0].rstrip("/").rsplit("/", 1)[-1]  # type: ignore[attr-defined]
            kinds[f"{url} ({request.headers.get('x-refresh-cause', '-')})"] += 1  # type: ignore[attr-defined]

        for tab in tabs:
            tab.on("request", seen)
        cpu0, t0 = _cpu_s(pid), time.monotonic()
        end = t0 + seconds
        while time.monotonic() < end:
            tabs[0].wait_for_timeout(250)  # keeps Playwright's event loop turning
        cpu1, elapsed = _cpu_s(pid), time.monotonic() - t0
        browser.close()
    print(dict(kinds), flush=True)
    per = pages * elapsed / 60
    return counts[0] / per, (cpu1 - cpu0) / per


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--write-docs", action="store_true")
    args = parser.parse_args()
    host = machine()

    from bench import django_env

    db_url = django_env.setup("push")
    job, alloc, user, password = _scene()
    stop = threading.Event()
    driver = threading.Thread(target=_driver, args=(job, alloc, stop), daemon=True)
    driver.start()
    results: dict[str, list[tuple[float, float]]] = {"polled": [], "pushed": []}
    try:
        for _ in range(args.rounds):
            for mode in ("polled", "pushed"):
                port = _free_port()
                env = {
                    **os.environ,
                    "DATABASE_URL": db_url,
                    "PUSH_ENABLED": str(mode == "pushed").lower(),
                }
                server = subprocess.Popen(
                    [
                        str(Path(sys.executable).parent / "uvicorn"),
                        "config.asgi:application",
                        "--port",
                        str(port),
                        "--log-level",
                        "warning",
                    ],
                    cwd=REPO,
                    env=env,
                )
                try:
                    for _ in range(300):
                        try:
                            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                            break
                        except OSError:
                            time.sleep(0.2)
                    results[mode].append(
                        _measure(
                            f"http://127.0.0.1:{port}",
                            server.pid,
                            job.pk,
                            user.email,
                            password,
                            args.pages,
                            args.seconds,
                        )
                    )
                finally:
                    server.terminate()
                    server.wait(20)
    finally:
        stop.set()
        driver.join(10)
        django_env.teardown()

    rows = []
    for mode in ("polled", "pushed"):
        reqs = [r for r, _ in results[mode]]
        cpu = [c for _, c in results[mode]]
        rows.append(
            [
                mode,
                f"{statistics.median(reqs):.1f} ({min(reqs):.1f}–{max(reqs):.1f})",
                f"{statistics.median(cpu) * 1000:.0f} ({min(cpu) * 1000:.0f}–{max(cpu) * 1000:.0f})",
            ]
        )
    ratio_r = statistics.median(r for r, _ in results["polled"]) / max(
        0.01, statistics.median(r for r, _ in results["pushed"])
    )
    ratio_c = statistics.median(c for _, c in results["polled"]) / max(
        1e-6, statistics.median(c for _, c in results["pushed"])
    )
    table = markdown_table(
        ["job page", "requests / page / min (median, range)", "server CPU ms / page / min"], rows
    )
    body = (
        f"`{command_line('bench.push_pages')}`\n\n"
        f"{args.pages} open job pages of a running job (heartbeat every 10 s, a log line every 5 s), "
        f"{args.seconds:.0f} s per run, {args.rounds} runs of each, alternating; the baseline is the "
        f"same server with `PUSH_ENABLED=false` (pages poll as before).\n\n{table}\n\n"
        f"Polled / pushed: {ratio_r:.1f}× the requests, {ratio_c:.1f}× the server CPU.\n\n"
        f"{host}\n"
    )
    print(body)
    if args.write_docs:
        write_section("push_pages", "## Pushed page updates\n\n" + body)


if __name__ == "__main__":
    main()
