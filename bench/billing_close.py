"""Billing benchmark: close one month for 1,000 accounts holding 1,000,000 usage records.

.venv/bin/python -m bench.billing_close [--accounts 1000] [--jobs-per-account 10] [--hours 100]

Builds a throwaway PostgreSQL database (`bench_billing`, migrated from scratch), fills it with
a fleet, projects, one billing account each (10 % with a reserved plan, 10 % with credits,
10 % taxed) and finished allocations of whole hours in March 2025, writes their usage records
in bulk (exactly the slices the meter writes), then times `invoice_close` for every account and
checks that every record landed on an invoice and every invoice is the sum of its lines.
Writes its table to the "Benchmark" section of docs/billing.md (--no-docs: print only).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")

import django

django.setup()

from django.conf import settings  # noqa: E402
from django.db import connection  # noqa: E402

from bench import REPO, command_line, machine, markdown_table, spread  # noqa: E402

DOCS = REPO / "docs" / "billing.md"
MARCH = date(2025, 3, 1)
CLOSE_AT = datetime(2025, 4, 1, 1, 0, tzinfo=UTC)
GPUS_PER_NODE = 8


def write_section(path: Path, name: str, body: str) -> None:
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    text = path.read_text(encoding="utf-8") if path.exists() else "# Billing\n"
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text)
    else:
        text = text.rstrip() + "\n\n## Benchmark\n\n" + block + "\n"
    path.write_text(text, encoding="utf-8")


def build(accounts: int, jobs_per_account: int, hours: int) -> dict[str, float]:
    """Fill the bench database; returns seconds per phase."""
    from billing import services
    from billing.models import BillingAccount, CreditGrant, Invoice, ProjectBilling
    from portal.models import Membership, Project, Role, User
    from scheduler.models import Allocation, Gpu, GpuModel, Job, JobState, Node, Pool, Quota
    from scheduler.seed import catalog_seed

    timings: dict[str, float] = {}
    t = time.perf_counter()
    catalog_seed()
    services.price_list_seed()
    models = list(GpuModel.objects.filter(name__in=["H100-80GB-SXM", "A100-80GB", "L4"]))
    if not models:
        models = list(GpuModel.objects.all()[:3])
    pool, _ = Pool.objects.get_or_create(name="default")
    allocations = accounts * jobs_per_account
    slots_per_gpu = max(1, (744 - 24) // hours)
    gpus_needed = -(-allocations // slots_per_gpu)
    nodes = Node.objects.bulk_create(
        Node(
            name=f"bench-{i:05d}",
            pool=pool,
            state=Node.State.READY,
            cpu_milli=128_000,
            memory_mib=1_000_000,
        )
        for i in range(-(-gpus_needed // GPUS_PER_NODE))
    )
    gpus = Gpu.objects.bulk_create(
        Gpu(
            node=node,
            index=k,
            uuid=f"GPU-bench-{node.pk}-{k}",
            model=models[n % len(models)],
            memory_mib=80_000,
        )
        for n, node in enumerate(nodes)
        for k in range(GPUS_PER_NODE)
    )
    users = User.objects.bulk_create(
        User(email=f"owner{i}@bench.example", password="!") for i in range(accounts)
    )
    projects = Project.objects.bulk_create(
        Project(slug=f"bench-{i:05d}", name=f"Bench {i}") for i in range(accounts)
    )
    Quota.objects.bulk_create(Quota(project=p) for p in projects)
    Membership.objects.bulk_create(
        Membership(project=p, user=u, role=Role.OWNER) for p, u in zip(projects, users, strict=True)
    )
    accts = BillingAccount.objects.bulk_create(
        BillingAccount(name=p.name, tax_rate=Decimal("0.19") if i % 10 == 3 else Decimal(0))
        for i, p in enumerate(projects)
    )
    ProjectBilling.objects.bulk_create(
        ProjectBilling(project=p, account=a) for p, a in zip(projects, accts, strict=True)
    )
    CreditGrant.objects.bulk_create(
        CreditGrant(
            account=a, amount=Decimal("500.00"), granted_at=datetime(2025, 1, 1, tzinfo=UTC)
        )
        for i, a in enumerate(accts)
        if i % 10 == 5
    )
    for i, a in enumerate(accts):
        if i % 10 == 7:
            services.reserved_plan_create(
                actor=None,
                account=a,
                gpu_model=models[0],
                gpus=2,
                term_months=12,
                starts_at=datetime(2025, 2, 1, tzinfo=UTC),
            )
    jobs = Job.objects.bulk_create(
        Job(
            project=projects[n // jobs_per_account],
            submitted_by=users[n // jobs_per_account],
            name=f"train-{n}",
            command="python train.py",
            state=JobState.SUCCEEDED,
            preemptible=n % 7 == 0,
        )
        for n in range(allocations)
    )
    month = datetime(2025, 3, 1, tzinfo=UTC)
    Allocation.objects.bulk_create(
        Allocation(
            job=job,
            gpu=gpus[n % len(gpus)],
            node_id=gpus[n % len(gpus)].node_id,
            attempt=1,
            share_milli=1000,
            gpu_model_id=gpus[n % len(gpus)].model_id,
            started_at=month + timedelta(hours=(n // len(gpus)) * hours),
            ended_at=month + timedelta(hours=(n // len(gpus) + 1) * hours),
            end_reason="node_lost" if n % 97 == 0 else "completed",
        )
        for n, job in enumerate(jobs)
    )
    # metering writes each record onto its account's draft invoice for the month
    Invoice.objects.bulk_create(
        Invoice(
            account=a,
            period_start=MARCH,
            period_end=date(2025, 4, 1),
            number=services.invoice_number(a.pk, MARCH),
            status=Invoice.Status.DRAFT,
        )
        for a in accts
    )
    timings["fixtures"] = time.perf_counter() - t
    t = time.perf_counter()
    with connection.cursor() as cur:
        # exactly the hour slices the meter writes for whole-hour allocations
        cur.execute(
            """
            INSERT INTO billing_usagerecord (
                allocation_id, job_id, project_id, account_id, gpu_model_id, price_version_id,
                period_start, slice_start, slice_end, seconds, share_milli, billed_milli,
                milli_seconds, covered_milli_seconds, tier, rate, gross_amount, amount,
                fault_credit, invoice_id, created_at)
            SELECT a.id, a.job_id, j.project_id, pb.account_id, a.gpu_model_id, pv.id,
                   %s, a.started_at + g * interval '1 hour', a.started_at + (g + 1) * interval '1 hour',
                   3600, 1000, 1000, 3600000, 0,
                   CASE WHEN j.preemptible THEN 'preemptible' ELSE 'on_demand' END,
                   r.rate, r.rate, r.rate, a.end_reason = 'node_lost', inv.id, now()
            FROM scheduler_allocation a
            JOIN scheduler_job j ON j.id = a.job_id
            JOIN billing_projectbilling pb ON pb.project_id = j.project_id
            JOIN billing_invoice inv ON inv.account_id = pb.account_id AND inv.period_start = %s
            JOIN billing_priceversion pv ON pv.gpu_model_id = a.gpu_model_id
            CROSS JOIN LATERAL (SELECT CASE WHEN j.preemptible
                THEN round(pv.on_demand_per_gpu_hour * (1 - pv.preemptible_discount), 4)
                ELSE pv.on_demand_per_gpu_hour END AS rate) r
            CROSS JOIN generate_series(0, %s - 1) g
            """,
            [MARCH, MARCH, hours],
        )
        cur.execute(
            """
            INSERT INTO billing_allocationmeter (allocation_id, metered_until, done, fault_credited)
            SELECT id, ended_at, true, end_reason = 'node_lost' FROM scheduler_allocation
            """
        )
        cur.execute("ANALYZE")
    timings["records"] = time.perf_counter() - t
    return timings


def close_all() -> tuple[float, list[float], int]:
    """Close every account; the email and Stripe tasks each close enqueues after commit are
    counted here instead of sent (they are separate, retried tasks, not part of the close)."""
    from billing import services
    from billing.models import BillingAccount
    from billing.services import invoices

    # services enqueue tasks by name (foundation.enqueue); count the invoice tasks instead
    enqueued: list[str] = []
    invoices.enqueue = lambda name, *args, **kwargs: enqueued.append(name)  # type: ignore[assignment]
    per_account: list[float] = []
    start = time.perf_counter()
    # the production path (task billing.close_month): meter everything once, then close each
    services.usage_meter(now=CLOSE_AT)
    for account_id in BillingAccount.objects.order_by("pk").values_list("pk", flat=True):
        t = time.perf_counter()
        services.invoice_close(account_id=account_id, period_start=MARCH, now=CLOSE_AT, meter=False)
        per_account.append(time.perf_counter() - t)
    return time.perf_counter() - start, per_account, len(enqueued)


def verify() -> dict[str, object]:
    from django.db.models import Count, Sum

    from billing.models import Invoice, InvoiceLine, UsageRecord

    unbilled = UsageRecord.objects.filter(invoice__status=Invoice.Status.DRAFT).count()
    mismatched = 0
    line_sums = dict(
        InvoiceLine.objects.values_list("invoice_id")
        .annotate(s=Sum("amount"))
        .values_list("invoice_id", "s")
    )
    for pk, total in Invoice.objects.values_list("pk", "total"):
        if line_sums.get(pk, Decimal(0)) != total:
            mismatched += 1
    return {
        "invoices": Invoice.objects.count(),
        "lines": InvoiceLine.objects.count(),
        "records": UsageRecord.objects.count(),
        "unbilled": unbilled,
        "mismatched": mismatched,
        "kinds": dict(InvoiceLine.objects.values_list("kind").annotate(n=Count("id"))),
        "revenue": Invoice.objects.aggregate(t=Sum("total"))["t"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--accounts", type=int, default=1000)
    ap.add_argument("--jobs-per-account", type=int, default=10)
    ap.add_argument("--hours", type=int, default=100, help="hours per allocation (one record each)")
    ap.add_argument("--no-docs", action="store_true", help="print only")
    ap.add_argument("--keep", action="store_true", help="keep the bench database afterwards")
    args = ap.parse_args()
    host = machine()  # at the start: the load average is the one the close began under
    if connection.vendor != "postgresql":
        print("The billing benchmark needs PostgreSQL (set DATABASE_URL).", file=sys.stderr)
        return 2
    # its own database, named after the configured one, so parallel runs do not collide
    name = f"{settings.DATABASES['default']['NAME']}_bench_billing"
    settings.DATABASES["default"].setdefault("TEST", {})["NAME"] = name
    old_name = connection.creation.create_test_db(verbosity=0, autoclobber=True, keepdb=False)
    try:
        timings = build(args.accounts, args.jobs_per_account, args.hours)
        elapsed, per_account, enqueued = close_all()
        check = verify()
    finally:
        if not args.keep:
            connection.creation.destroy_test_db(old_name, verbosity=0)
    records = int(check["records"])  # type: ignore[call-overload]
    ok = check["unbilled"] == 0 and check["mismatched"] == 0 and check["invoices"] == args.accounts
    rows = [
        ["accounts closed", f"{check['invoices']:,}"],
        ["usage records", f"{records:,}"],
        [
            "invoice lines",
            f"{check['lines']:,} ({', '.join(f'{k} {v}' for k, v in sorted(check['kinds'].items()))})",
        ],  # type: ignore[union-attr]
        ["close, all accounts", f"{elapsed:.1f} s (target < 60 s)"],
        ["per account, median (min–max)", spread([t * 1000 for t in per_account], 0) + " ms"],
        [
            "per account, median / p95",
            f"{statistics.median(per_account) * 1000:.0f} ms / {sorted(per_account)[int(len(per_account) * 0.95) - 1] * 1000:.0f} ms",
        ],
        ["records per second", f"{records / elapsed:,.0f}"],
        ["invoice emails enqueued (not sent)", f"{enqueued:,}"],
        [
            "fixtures / bulk records (not timed)",
            f"{timings['fixtures']:.1f} s / {timings['records']:.1f} s",
        ],
        ["every record invoiced, totals = Σ lines", "yes" if ok else f"NO: {check}"],
        ["revenue billed", f"${check['revenue']:,}"],
    ]
    table = markdown_table(["measure", "value"], rows)
    print(table)
    if not args.no_docs:
        body = (
            f"`{command_line('bench.billing_close')}` on {os.cpu_count()} CPU cores, PostgreSQL "
            f"(one process, accounts closed one after another):\n\n{table}\n\n{host}\n"
        )
        write_section(DOCS, "billing_close", body)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
