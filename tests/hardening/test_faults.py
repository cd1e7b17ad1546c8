"""Faults injected into the real stack, then the invariants (tests/hardening/invariants.py):
no GPU double-allocated, no job lost or running twice, no usage lost or counted twice, no
invoice issued twice.

- a Celery worker process (a real `celery -A config worker` subprocess) SIGKILLed in the middle
  of metering, invoicing and a scheduling cycle: acks_late + reject_on_worker_lost redeliver the
  task, which must be idempotent;
- PostgreSQL connections terminated (pg_terminate_backend) while jobs run on the stack;
- a node agent frozen (SIGSTOP: no heartbeat → node lost → job requeued elsewhere) and thawed
  (SIGCONT: it comes back fenced and stops its old work), and an agent SIGKILLed;
- Stripe answering 500, timing out, and webhooks delivered twice and out of order.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, date, datetime, timedelta
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
from django.db import connection
from rest_framework.test import APIClient

from tests.hardening.invariants import assert_invariants, ledger
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.faults, pytest.mark.django_db(transaction=True)]


def _at(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)


# --- a real worker process ------------------------------------------------------------------


class Worker:
    """`celery -A config worker` (prefork, one child) on this test run's broker and database."""

    def __init__(self, log: Path) -> None:
        db = connection.settings_dict
        env = dict(os.environ)
        env.update(
            DJANGO_SETTINGS_MODULE="config.settings.test",
            DATABASE_URL=f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
            PYTHONUNBUFFERED="1",
        )
        self.log = log
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "config",
                "worker",
                "-Q",
                "scheduler,billing,default",
                "-c",
                "1",
                "-P",
                "prefork",
                "--without-mingle",
                "--without-gossip",
                "-l",
                "info",
            ],
            cwd=ROOT,
            env=env,
            stdout=log.open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(lambda: "ready." in self.text() or self.proc.poll() is not None, timeout=60)
        assert self.proc.poll() is None, self.text()[-2000:]

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def children(self) -> list[int]:
        out = subprocess.run(
            ["pgrep", "-P", str(self.proc.pid)], capture_output=True, text=True, check=False
        ).stdout
        return [int(p) for p in out.split()]

    def kill_child(self) -> int:
        pid = self.children()[0]
        os.kill(pid, signal.SIGKILL)
        return pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def worker(tmp_path):
    started: list[Worker] = []

    def start() -> Worker:
        w = Worker(tmp_path / f"worker-{len(started)}.log")
        started.append(w)
        return w

    yield start
    for w in started:
        w.stop()


def _seed_usage(lab, count: int) -> None:
    """`count` finished allocations of 12 hours each in March 2025 (12 slices each)."""
    from scheduler.models import Allocation, Gpu, Job, JobState

    gpus = list(Gpu.objects.order_by("pk"))
    jobs = Job.objects.bulk_create(
        Job(
            project=lab["a"],
            submitted_by=lab["owner"],
            name=f"u{i}",
            command="true",
            state=JobState.SUCCEEDED,
            gpu_milli=500,
        )
        for i in range(count)
    )
    Allocation.objects.bulk_create(
        Allocation(
            job=job,
            gpu=gpus[i % len(gpus)],
            node_id=gpus[i % len(gpus)].node_id,
            attempt=1,
            share_milli=500,
            gpu_model_id=gpus[i % len(gpus)].model_id,
            started_at=_at("2025-03-01 00:00") + timedelta(hours=(i // len(gpus)) * 13),
            ended_at=_at("2025-03-01 00:00") + timedelta(hours=(i // len(gpus)) * 13 + 12),
            end_reason="completed",
        )
        for i, job in enumerate(jobs)
    )


def _remeter_from_scratch() -> list[tuple[object, ...]]:
    """The ledger a clean, uninterrupted metering run produces."""
    from billing import services
    from billing.models import AllocationMeter, UsageRecord

    UsageRecord.objects.all().delete()
    AllocationMeter.objects.all().delete()
    services.usage_meter()
    return ledger()


@pytest.mark.parametrize("task", ["meter", "close", "cycle"])
def test_worker_killed_mid_task_is_redelivered_and_idempotent(task, worker, team, fleet):
    from billing import services, tasks
    from billing.models import AllocationMeter, Invoice
    from scheduler.admission import JobSpec, job_submit
    from scheduler.models import Allocation
    from scheduler.tasks import scheduling_cycle

    lab = {**team, **fleet}
    rng = random.Random(f"kill-{task}")
    w = worker()
    if task == "cycle":
        for i in range(60):
            job_submit(
                actor=team["member"],
                project=team["a"],
                spec=JobSpec(name=f"c{i}", command="true", gpu_milli=250, gpu_memory_mib=1000),
            )
        scheduling_cycle.delay()
        time.sleep(rng.uniform(0.05, 0.4))
        w.kill_child()
        # Redelivered to a fresh child; then one more cycle to settle what is left.
        wait_for(lambda: Allocation.objects.exists(), timeout=60)
        scheduling_cycle.delay()
        time.sleep(3)
        assert_invariants()
        return
    total = 1600  # four metering batches of 500: the kill lands between two of them
    _seed_usage(lab, total)
    if task == "meter":
        tasks.meter.delay()
    else:
        account = services.account_open_for_project(project=team["a"])
        tasks.close_account.delay(account.pk, "2025-03-01", True)
    if task == "meter":
        # Kill the child once metering is under way (a batch committed) but not finished.
        wait_for(
            lambda: AllocationMeter.objects.filter(done=True).exists(), timeout=60, interval=0.02
        )
    else:
        # The close meters and issues in one transaction: kill it while that is open.
        wait_for(lambda: "billing.close_account" in w.text(), timeout=60, interval=0.02)
        time.sleep(rng.uniform(0.2, 0.6))
    done_at_kill = AllocationMeter.objects.filter(done=True).count()
    issued_at_kill = Invoice.objects.exclude(status="draft").exists()
    killed = w.kill_child()
    assert done_at_kill < total and not issued_at_kill, "the task ended before the kill"
    wait_for(lambda: killed not in w.children() and w.children(), timeout=30)
    wait_for(
        lambda: AllocationMeter.objects.filter(done=True).count() == total,
        timeout=120,
        interval=0.2,
    )
    if task == "close":
        wait_for(lambda: Invoice.objects.exclude(status="draft").exists(), timeout=60)
        assert Invoice.objects.filter(period_start=date(2025, 3, 1)).count() == 1
    assert "WorkerLostError" in w.text() or "worker lost" in w.text().lower(), w.text()[-2000:]
    assert_invariants()
    after_redelivery = ledger()
    # Metering again changes nothing; metering from scratch gives the very same ledger.
    services.usage_meter()
    assert ledger() == after_redelivery
    if task == "meter":
        assert _remeter_from_scratch() == after_redelivery


# --- the stack: live server, agents as processes, an in-process worker -------------------------


@pytest.fixture
def stack(celery_live_worker, agents, team, fleet, settings):
    from portal.services import token_create
    from scheduler.models import Node
    from scheduler.tasks import scheduling_cycle

    settings.AGENT_PORTAL_URL = agents.url
    for name in ("h1", "h2"):
        agents.start(name, fleet["tokens"][name], "2xH100-80GB-SXM")
    names = ["h1", "h2"]
    # Both agents registered (their inventory replaced the fixture's) before anything is placed:
    # a job placed on the fixture's GPUs would be lost to the "replaced GPU" rule.
    wait_for(
        lambda: (
            Node.objects.filter(name__in=names).exclude(driver_version="").count() == len(names)
        ),
        timeout=30,
    )
    wait_for(lambda: all(n.last_heartbeat_at for n in Node.objects.filter(name__in=names)))
    client = APIClient()
    secret = token_create(user=team["member"], name="faults").secret
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    # Beat's periodic cycle (the stack's only other trigger is a submit or an exit).
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(1.0):
            scheduling_cycle.delay()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    yield {"api": client, "agents": agents, **team, **fleet}
    stop.set()
    thread.join(timeout=5)


def submit(stack, **fields) -> int:
    body = {"project": "alpha", "name": "fault", "gpu_model": "H100-80GB-SXM", **fields}
    resp = stack["api"].post(f"{stack['agents'].url}/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()["id"]


def wait_jobs(predicate, ids: list[int], timeout: float) -> None:
    """wait_for, failing with each job's history (what happened instead)."""
    from scheduler.models import Job

    try:
        wait_for(predicate, timeout=timeout, interval=0.3)
    except AssertionError:
        history = {
            j.pk: [(e.to_state, e.reason) for e in j.events.all()]
            for j in Job.objects.filter(pk__in=ids)
        }
        raise AssertionError(f"jobs did not get there in {timeout}s: {history}") from None


def is_lost(name: str) -> bool:
    """Run the health sweep (beat's job) and say whether the node is lost now."""
    from scheduler.models import Node
    from scheduler.nodes import lost_nodes_sweep

    lost_nodes_sweep()
    return Node.objects.get(name=name).state == Node.State.LOST


def node_of(job_id: int) -> str | None:
    from scheduler.models import Allocation

    a = Allocation.objects.filter(job_id=job_id, ended_at__isnull=True).select_related("node")
    first = a.first()
    return first.node.name if first else None


def test_frozen_agent_loses_its_node_then_returns_fenced_and_stops_old_work(
    stack, settings, tmp_path
):
    from scheduler.models import Job, JobState, Node

    settings.NODE_LOST_AFTER_SECONDS = 3
    beats = tmp_path / "beats"
    beats.mkdir()
    # Each process of the job appends to its own file every 0.3 s while it lives.
    job_id = submit(
        stack,
        gpus=2,
        max_restarts=2,
        command=f"while true; do date +%s.%N >> {beats}/$$; sleep 0.3; done",
    )
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING, timeout=30)
    first = node_of(job_id)
    proc = stack["agents"].procs[first]
    os.kill(proc.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: is_lost(first), timeout=20)
        assert Node.objects.get(name=first).state == Node.State.LOST
        wait_for(
            lambda: (
                node_of(job_id) not in (None, first)
                and Job.objects.get(pk=job_id).state == JobState.RUNNING
            ),
            timeout=40,
        )
        assert_invariants()
    finally:
        os.kill(proc.pid, signal.SIGCONT)
    wait_for(lambda: Node.objects.get(name=first).fenced, timeout=20)
    # The old process (on the frozen node) stops; the new one keeps beating.
    time.sleep(6)
    files = sorted(beats.iterdir(), key=lambda p: p.stat().st_ctime)
    assert len(files) >= 2, [p.name for p in files]
    old, new = files[0], files[-1]
    old_size = old.stat().st_size
    new_size = new.stat().st_size
    time.sleep(2)
    assert old.stat().st_size == old_size, "the fenced node's old process still runs"
    assert new.stat().st_size > new_size, "the requeued attempt stopped running"
    job = Job.objects.get(pk=job_id)
    assert job.attempt >= 2 and job.state == JobState.RUNNING
    assert_invariants()


def test_killed_agent_node_is_lost_and_its_job_requeued(stack, settings):
    from scheduler.models import Job, JobState

    settings.NODE_LOST_AFTER_SECONDS = 3
    job_id = submit(stack, gpus=1, max_restarts=1, command="sleep 120")
    wait_for(lambda: Job.objects.get(pk=job_id).state == JobState.RUNNING, timeout=30)
    first = node_of(job_id)
    stack["agents"].stop(first, kill=True)
    wait_for(lambda: is_lost(first), timeout=20)
    wait_jobs(
        lambda: (
            node_of(job_id) not in (None, first)
            and Job.objects.get(pk=job_id).state == JobState.RUNNING
        ),
        [job_id],
        timeout=40,
    )
    assert_invariants()


def test_database_connections_dropped_while_jobs_run(stack):
    from scheduler.models import Job, JobState

    ids = [submit(stack, gpus=1, name=f"db{i}", command="sleep 2; echo ok") for i in range(4)]
    dbname = connection.settings_dict["NAME"]
    stop = threading.Event()
    killed: list[int] = []

    def chaos() -> None:
        import psycopg

        db = connection.settings_dict
        with psycopg.connect(
            host=db["HOST"], port=db["PORT"], user=db["USER"], dbname="postgres", autocommit=True
        ) as conn:
            while not stop.is_set():
                rows = conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (dbname,),
                ).fetchall()
                killed.append(len(rows))
                stop.wait(1.5)

    thread = threading.Thread(target=chaos, daemon=True)
    thread.start()
    try:
        time.sleep(6)
    finally:
        stop.set()
        thread.join(timeout=10)
    connection.close()  # ours was terminated too
    assert sum(killed) > 0, "no connection was dropped; the test proves nothing"
    wait_jobs(
        lambda: all(j.state == JobState.SUCCEEDED for j in Job.objects.filter(pk__in=ids)),
        ids,
        timeout=90,
    )
    assert_invariants()


# --- Stripe ---------------------------------------------------------------------------------


class FlakyStripe:
    """The billing tests' fake Stripe API, answering 500 or hanging for the first calls."""

    mode = ""
    remaining = 0


def _flaky_handler():
    from tests.billing.test_stripe import FakeStripe

    class Handler(FakeStripe):
        def do_POST(self):
            if FlakyStripe.remaining > 0:
                FlakyStripe.remaining -= 1
                if FlakyStripe.mode == "timeout":
                    time.sleep(3)
                body = json.dumps({"error": {"type": "api_error", "message": "boom"}}).encode()
                self.send_response(500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                return
            super().do_POST()

    return Handler


@pytest.fixture
def flaky_stripe(settings):
    from tests.billing.test_stripe import WHSEC, FakeStripe

    FakeStripe.calls, FakeStripe.replies, FakeStripe.fail_next = [], {}, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _flaky_handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.STRIPE_SECRET_KEY = "sk_test_local"
    settings.STRIPE_API_BASE = f"http://127.0.0.1:{server.server_port}"
    settings.STRIPE_WEBHOOK_SECRET = WHSEC
    settings.STRIPE_TIMEOUT_SECONDS = 1
    yield FakeStripe
    server.shutdown()
    server.server_close()


@pytest.fixture
def invoice(team, fleet):
    from billing import services

    _seed_usage({**team, **fleet}, 4)
    account = services.account_open_for_project(project=team["a"])
    return services.invoice_close(
        account_id=account.pk, period_start=date(2025, 3, 1), now=_at("2025-04-01 01:00")
    )


@pytest.mark.parametrize("mode", ["500", "timeout"])
def test_stripe_errors_and_timeouts_resume_without_duplicates(mode, invoice, flaky_stripe):
    from billing import gateway, services
    from billing.models import Invoice

    # More failures than the client retries: the push fails, quickly, and says why.
    FlakyStripe.mode, FlakyStripe.remaining = mode, 6
    started = time.monotonic()
    with pytest.raises(gateway.GatewayError):
        services.invoice_push_to_stripe(invoice_id=invoice.pk)
    assert time.monotonic() - started < 30, "a hanging Stripe held the worker too long"
    # Then Stripe recovers: the retry finishes the job with one object per ledger row.
    FlakyStripe.remaining = 0
    stripe_id = services.invoice_push_to_stripe(invoice_id=invoice.pk)
    ok = [c for c in flaky_stripe.calls if c["key"] in flaky_stripe.replies]
    keys = [c["key"] for c in ok]
    assert len(keys) == len(set(keys)), "a ledger row was sent to Stripe twice"
    assert sum(1 for c in ok if c["path"].endswith("/finalize")) == 1
    # one item per line that moves money (a 0 % tax line is stated on the invoice, not pushed)
    pushed = invoice.lines.exclude(amount=0).count()
    assert pushed >= 1 and invoice.lines.count() > pushed
    assert sum(1 for c in ok if c["path"] == "/v1/invoiceitems") == pushed
    row = Invoice.objects.get(pk=invoice.pk)
    assert row.stripe_finalized and row.stripe_invoice_id == stripe_id


def test_stripe_webhooks_twice_and_out_of_order(invoice, flaky_stripe, client):
    from billing.models import Invoice, StripeEvent
    from tests.billing.test_stripe import event, post_event

    paid = event("invoice.paid", invoice, created=300, event_id="evt_paid")
    failed = event("invoice.payment_failed", invoice, created=200, event_id="evt_failed")
    outcomes = [post_event(client, e).json()["outcome"] for e in (paid, failed, paid, failed)]
    assert outcomes[0] == "paid" and outcomes[2:] == ["duplicate", "duplicate"]
    assert Invoice.objects.get(pk=invoice.pk).status == "paid"
    assert StripeEvent.objects.count() == 2
    assert_invariants()
