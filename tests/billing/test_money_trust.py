"""Money you can trust (issue 16): hard caps that hold, shares billed as placed, tiny and
memory-bound shares, reserved plan months, credit validity, whole-second price versions, one
currency, budget notices, one cost and one money format everywhere."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

import pytest
from django.core import mail
from django.core.exceptions import ValidationError
from django.template import Context, Template
from django.utils import timezone

from billing import admission, pricing, selectors, services
from billing.models import BudgetAlert, CreditApplication, InvoiceLine, Notification, UsageRecord
from portal.errors import DomainError
from portal.money import format_money
from scheduler.admission import JobSpec
from scheduler.core.model import MIN_BILLED_MILLI, billed_share_milli
from scheduler.estimates import quote
from scheduler.models import Allocation, Gpu, Job, JobState
from tests.billing.conftest import at

pytestmark = pytest.mark.django_db
MARCH = date(2025, 3, 1)
APRIL_1 = at("2025-04-01 00:30")


def close(project, period=MARCH, now=APRIL_1):
    account = services.account_open_for_project(project=project)
    return services.invoice_close(account_id=account.pk, period_start=period, now=now)


def h100_rate(lab, preemptible=False):
    return selectors.quote_rate(gpu_model=lab["h100"], preemptible=preemptible)


def submit(api, user, **fields):
    body = {"project": "alpha", "name": "train", "command": "python train.py", **fields}
    resp = api(user).post("/api/v1/jobs", body, format="json")
    assert resp.status_code == 201, resp.content
    return resp.json()


# ---- 1. the hard cap holds ---------------------------------------------------------------


def test_admission_counts_the_expected_cost_of_the_job_it_admits(lab, api):
    services.budget_set(
        actor=lab["owner"], project=lab["a"], monthly_amount=Decimal("10"), hard_cap=True
    )
    # 4 × H100 with no time limit: the stated assumption (one hour) already exceeds $10
    big = submit(api, lab["member"], gpu_model="H100-80GB-SXM", gpus=4)
    assert big["state"] == "rejected"
    assert "Budget exhausted" in big["failure_reason"]
    assert "no time limit" in big["failure_reason"] and "expected" in big["failure_reason"]
    # the same job with a time limit it can afford is admitted
    minutes = int(Decimal(10) / (4 * h100_rate(lab)) * 60) - 1
    small = submit(api, lab["member"], gpu_model="H100-80GB-SXM", gpus=4, time_limit_s=minutes * 60)
    assert small["state"] == "queued"


def test_the_cap_gives_notice_then_stops_running_work(
    lab, place, django_capture_on_commit_callbacks, settings, monkeypatch
):
    settings.BILLING_CAP_CHECK_SECONDS = 600
    now = timezone.now()
    rate = h100_rate(lab)
    running = place(start=now - timedelta(hours=1))
    spare = place(start=now - timedelta(hours=1), preemptible=True)
    # spend ≈ 1 h on demand + 1 h preemptible; burn the same per hour
    spent = selectors.project_spend(project_ids={lab["a"].pk}, now=now)[lab["a"].pk]
    burn = selectors.project_burn_per_hour(project_id=lab["a"].pk, now=now)
    budget = pricing.to_cents(spent + burn * Decimal("0.1"))  # reached within the next check
    services.budget_set(
        actor=lab["owner"],
        project=lab["a"],
        monthly_amount=budget,
        hard_cap=True,
        preemptible_allowance_percent=100,
    )
    with django_capture_on_commit_callbacks(execute=True):
        result = services.budget_caps_enforce(now=now)
    assert result.noticed == [lab["a"].pk] and result.stopped == []
    notice = Notification.objects.get(project=lab["a"], kind="budget_cap")
    assert "will then be stopped" in notice.message
    assert any("hard budget cap ahead" in m.subject for m in mail.outbox)
    assert services.budget_caps_enforce(now=now).noticed == []  # once
    # past the cap: the non-preemptible job is stopped with its grace, the preemptible one runs
    later = now + timedelta(minutes=12)
    result = services.budget_caps_enforce(now=later)
    assert result.stopped == [running.job_id]
    assert Job.objects.get(pk=running.job_id).state == JobState.PREEMPTING
    assert Job.objects.get(pk=spare.job_id).state == JobState.RUNNING
    monkeypatch.setattr("django.utils.timezone.now", lambda: later)
    assert admission.projects_at_cap(project_ids={lab["a"].pk}) == {lab["a"].pk}
    monkeypatch.undo()
    # a preemption the cap made is the customer's budget, not a platform fault: billed
    Allocation.objects.filter(pk=running.pk).update(ended_at=later, end_reason="preempted")
    services.usage_meter(now=later + timedelta(seconds=1))
    assert not UsageRecord.objects.filter(allocation=running, fault_credit=True).exists()
    assert rate > 0


def test_a_job_the_cap_stopped_waits_while_preemptible_work_may_start(lab, place, monkeypatch):
    now = at("2025-06-15 12:00")
    monkeypatch.setattr("django.utils.timezone.now", lambda: now)
    services.budget_set(
        actor=lab["owner"],
        project=lab["a"],
        monthly_amount=(h100_rate(lab) * Decimal("0.8")).quantize(Decimal("0.01")),
        hard_cap=True,
        preemptible_allowance_percent=100,
    )
    # one H100-hour: past the cap, within the preemptible allowance
    place(start=timezone.now() - timedelta(hours=1), end=timezone.now() - timedelta(minutes=1))
    assert admission.projects_over_budget(project_ids={lab["a"].pk}) == set()
    assert admission.projects_at_cap(project_ids={lab["a"].pk}) == {lab["a"].pk}
    from scheduler.cycle import run_cycle

    held = Job.objects.create(
        project=lab["a"],
        submitted_by=lab["owner"],
        name="held",
        command="true",
        gpu_model=lab["h100"],
        state=JobState.QUEUED,
        queued_at=timezone.now(),
    )
    run_cycle()
    held.refresh_from_db()
    assert held.state == JobState.QUEUED and held.pending_reason == "budget"


# ---- 2 and 3. shares bill as placed: the larger of compute and memory, a minimum ---------


def test_a_share_bills_what_was_frozen_at_placement(lab, api):
    from scheduler.cycle import run_cycle

    job = submit(api, lab["member"], gpu_model="L4", gpu_milli=500)
    run_cycle()
    alloc = Allocation.objects.get(job_id=job["id"])
    assert alloc.gpu.capacity_milli == 2000 and alloc.billed_milli == 250
    # the device's sharing changes behind the rules' back: the share still bills as placed
    Gpu.objects.filter(pk=alloc.gpu_id).update(oversubscription=1)
    start = alloc.started_at
    Allocation.objects.filter(pk=alloc.pk).update(
        ended_at=start + timedelta(hours=1), end_reason="completed"
    )
    services.usage_meter(now=start + timedelta(hours=2))
    records = UsageRecord.objects.filter(allocation=alloc)
    assert records and {r.billed_milli for r in records} == {250}


def test_sharing_edits_are_refused_under_running_shares(lab, place):
    gpu = Gpu.objects.filter(model=lab["l4"]).order_by("pk").first()
    alloc = place(gpu=gpu, share=500, start=timezone.now() - timedelta(minutes=5))
    gpu.oversubscription = 1
    with pytest.raises(ValidationError, match="running share"):
        gpu.full_clean()
    gpu.oversubscription = 2
    gpu.full_clean()  # an unchanged GPU is fine
    Allocation.objects.filter(pk=alloc.pk).update(ended_at=timezone.now())
    gpu.oversubscription = 1
    gpu.full_clean()  # and an idle one may change


def test_tiny_and_memory_bound_shares_bill_their_larger_part_and_a_minimum(lab, place):
    assert billed_share_milli(1, 2000) == MIN_BILLED_MILLI  # was 0
    assert billed_share_milli(100, 1000, 80_000, 80_000) == 1000  # all the memory
    assert billed_share_milli(500, 2000, 8_000, 80_000) == 250
    l4 = Gpu.objects.filter(model=lab["l4"]).order_by("pk").first()
    tiny = place(gpu=l4, share=1, start=at("2025-03-03 10:00"), end=at("2025-03-03 11:00"))
    hog = place(
        gpu=l4,
        share=100,
        memory_mib=l4.memory_mib,
        start=at("2025-03-03 10:00"),
        end=at("2025-03-03 11:00"),
    )
    services.usage_meter(now=at("2025-03-04 00:00"))
    assert UsageRecord.objects.get(allocation=tiny).billed_milli == MIN_BILLED_MILLI
    assert UsageRecord.objects.get(allocation=hog).billed_milli == 1000
    assert UsageRecord.objects.get(allocation=tiny).amount > 0


def test_quotes_use_the_same_rule(lab):
    rate = selectors.quote_rate(gpu_model=lab["l4"], preemptible=False)
    whole_memory = JobSpec(
        name="x",
        command="true",
        gpus=1,
        gpu_milli=100,
        gpu_memory_mib=lab["l4"].memory_mib,
        gpu_model=lab["l4"],
    )
    assert quote(whole_memory)[1] == rate.quantize(Decimal("0.01"))
    tiny = JobSpec(name="x", command="true", gpus=1, gpu_milli=1, gpu_model=lab["l4"])
    assert quote(tiny)[1] == (rate * MIN_BILLED_MILLI / 1000).quantize(Decimal("0.01"))


# ---- 4. reserved plans ---------------------------------------------------------------------


@pytest.mark.parametrize("start_day", [1, 10, 28])
def test_a_one_month_plan_costs_its_fee_whatever_its_start_day(lab, start_day):
    account = services.account_open_for_project(project=lab["a"])
    plan = services.reserved_plan_create(
        actor=None,
        account=account,
        gpu_model=lab["h100"],
        gpus=1,
        term_months=1,
        starts_at=at(f"2025-02-{start_day:02d} 00:00"),
    )
    feb = close(lab["a"], period=date(2025, 2, 1), now=at("2025-03-01 00:30"))
    mar = close(lab["a"], period=MARCH, now=at("2025-04-01 00:30"))
    fees = [
        line.amount
        for inv in (feb, mar)
        for line in inv.lines.filter(kind=InvoiceLine.Kind.RESERVED_FEE)
    ]
    assert sum(fees) == plan.monthly_fee and len(fees) == 1


def test_fault_credited_usage_does_not_use_up_the_reservation(lab, place):
    account = services.account_open_for_project(project=lab["a"])
    services.reserved_plan_create(
        actor=None,
        account=account,
        gpu_model=lab["h100"],
        gpus=1,
        term_months=1,
        starts_at=at("2025-03-01 00:00"),
    )
    gpus = list(Gpu.objects.filter(model=lab["h100"]).order_by("pk"))
    lost = place(
        gpu=gpus[0],
        start=at("2025-03-03 10:00"),
        end=at("2025-03-03 12:00"),
        end_reason="node_lost",
    )
    used = place(gpu=gpus[1], start=at("2025-03-03 10:00:01"), end=at("2025-03-03 12:00"))
    invoice = close(lab["a"])
    assert not UsageRecord.objects.filter(allocation=lost, covered_milli_seconds__gt=0).exists()
    assert all(
        r.covered_milli_seconds == r.milli_seconds
        for r in UsageRecord.objects.filter(allocation=used)
    )
    overage = invoice.lines.filter(kind=InvoiceLine.Kind.USAGE)
    fault = invoice.lines.filter(kind=InvoiceLine.Kind.FAULT_CREDIT)
    assert sum(x.amount for x in overage) + sum(x.amount for x in fault) == 0


def test_a_plans_gpus_and_start_change_only_by_a_new_version(lab):
    account = services.account_open_for_project(project=lab["a"])
    now = timezone.now()
    plan = services.reserved_plan_create(
        actor=None,
        account=account,
        gpu_model=lab["h100"],
        gpus=2,
        term_months=12,
        starts_at=now - timedelta(days=3),
    )
    plan.gpus = 4
    with pytest.raises(ValidationError, match="frozen"):
        plan.full_clean()
    plan.refresh_from_db()
    plan.starts_at -= timedelta(days=1)
    with pytest.raises(ValidationError, match="frozen"):
        plan.full_clean()
    plan.refresh_from_db()
    new = services.reserved_plan_revise(
        actor=lab["owner"], plan=plan, gpus=4, effective_at=now + timedelta(hours=1)
    )
    plan.refresh_from_db()
    assert plan.ends_at == new.starts_at == pricing.add_months(plan.starts_at, 1)  # plan month
    assert new.supersedes == plan
    assert new.gpus == 4 and new.monthly_fee > plan.monthly_fee
    with pytest.raises(DomainError):
        services.reserved_plan_revise(
            actor=None, plan=new, gpus=1, effective_at=now - timedelta(days=1)
        )


# ---- 5. credits pay only inside their validity ---------------------------------------------


def test_a_credit_pays_only_for_usage_inside_its_validity(lab, place):
    account = services.account_open_for_project(project=lab["a"])
    services.credit_grant(
        actor=None,
        account=account,
        amount=Decimal("1000"),
        granted_at=at("2025-03-01 00:00"),
        expires_at=at("2025-03-05 00:00"),
    )
    place(start=at("2025-03-20 10:00"), end=at("2025-03-20 12:00"))
    invoice = close(lab["a"])
    assert invoice.credits_applied == 0 and not CreditApplication.objects.exists()
    assert invoice.total > 0


def test_a_credit_pays_the_part_of_a_month_it_covers(lab, place):
    account = services.account_open_for_project(project=lab["a"])
    services.credit_grant(
        actor=None,
        account=account,
        amount=Decimal("1000"),
        granted_at=at("2025-03-01 00:00"),
        expires_at=at("2025-03-05 00:00"),
    )
    inside = place(start=at("2025-03-03 10:00"), end=at("2025-03-03 12:00"))
    place(start=at("2025-03-20 10:00"), end=at("2025-03-20 12:00"))
    invoice = close(lab["a"])
    inside_cost = pricing.to_cents(
        sum(r.amount for r in UsageRecord.objects.filter(allocation=inside))
    )
    assert invoice.credits_applied == inside_cost
    assert invoice.total == invoice.subtotal - inside_cost


# ---- 8. price versions at whole seconds ----------------------------------------------------


def test_a_price_version_at_a_fraction_of_a_second_loses_no_second(lab, place):
    services.price_list_seed()
    version = services.price_publish(
        actor=None,
        gpu_model=lab["h100"],
        effective_from=at("2025-03-03 10:30") + timedelta(microseconds=500_000),
        on_demand_per_gpu_hour=Decimal("1.2345"),
        now=at("2025-03-01 00:00"),
    )
    assert version.effective_from == at("2025-03-03 10:30")
    alloc = place(start=at("2025-03-03 10:00"), end=at("2025-03-03 11:00"))
    services.usage_meter(now=at("2025-03-04 00:00"))
    assert sum(r.seconds for r in UsageRecord.objects.filter(allocation=alloc)) == 3600


def test_a_stored_fractional_price_start_is_read_at_its_whole_second(lab, place):
    services.price_list_seed()
    version = services.price_publish(
        actor=None,
        gpu_model=lab["h100"],
        effective_from=at("2025-03-03 10:30"),
        on_demand_per_gpu_hour=Decimal("1.2345"),
        now=at("2025-03-01 00:00"),
    )
    type(version).objects.filter(pk=version.pk).update(
        effective_from=at("2025-03-03 10:30") + timedelta(microseconds=250_000)
    )
    alloc = place(start=at("2025-03-03 10:00"), end=at("2025-03-03 11:00"))
    services.usage_meter(now=at("2025-03-04 00:00"))
    assert sum(r.seconds for r in UsageRecord.objects.filter(allocation=alloc)) == 3600


# ---- 9. one currency for the installation ---------------------------------------------------


def test_an_account_in_another_currency_is_refused(lab, place):
    account = services.account_open_for_project(project=lab["a"])
    account.currency = "eur"
    with pytest.raises(ValidationError, match="USD"):
        account.full_clean()
    account.save()  # an account labelled before the rule
    place(start=at("2025-03-03 10:00"), end=at("2025-03-03 11:00"))
    with pytest.raises(DomainError, match="bills in USD"):
        close(lab["a"])
    account.currency = "usd"
    account.save()
    assert close(lab["a"]).currency == "usd"


# ---- budgets -------------------------------------------------------------------------------


def test_several_thresholds_at_once_make_one_notice_naming_the_highest(
    lab, place, django_capture_on_commit_callbacks
):
    now = at("2025-06-15 12:00")
    services.budget_set(actor=lab["owner"], project=lab["a"], monthly_amount=h100_rate(lab) * 2)
    place(start=now - timedelta(hours=3), end=now - timedelta(minutes=30))  # 125 %
    with django_capture_on_commit_callbacks(execute=True):
        alerts = services.budgets_check(now=now)
    assert [a.threshold for a in alerts] == [100]
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [50, 80, 100]
    notes = list(Notification.objects.filter(project=lab["a"], kind="budget"))
    assert len(notes) == 1 and "(100 %)" in notes[0].message
    assert len(mail.outbox) == 1 and "100 %" in mail.outbox[0].subject


def test_raising_a_budget_re_arms_the_thresholds_above_the_new_amount(lab, place, monkeypatch):
    now = at("2025-06-15 12:00")
    monkeypatch.setattr("django.utils.timezone.now", lambda: now)
    rate = h100_rate(lab)
    gpus = list(Gpu.objects.filter(model=lab["h100"]).order_by("pk"))
    services.budget_set(actor=lab["owner"], project=lab["a"], monthly_amount=rate * 2)
    place(gpu=gpus[0], start=now - timedelta(hours=3), end=now - timedelta(minutes=30))  # 125 %
    assert [a.threshold for a in services.budgets_check(now=now)] == [100]
    services.budget_set(actor=lab["owner"], project=lab["a"], monthly_amount=rate * 4)  # 62 %
    assert sorted(BudgetAlert.objects.values_list("threshold", flat=True)) == [50]
    assert services.budgets_check(now=now) == []
    place(gpu=gpus[1], start=now - timedelta(hours=1), end=now)  # 3.5 h of 4: 87 %
    assert [a.threshold for a in services.budgets_check(now=now)] == [80]


# ---- one cost everywhere, one money format -------------------------------------------------


def test_the_job_usage_efficiency_and_invoice_figures_agree(lab, place, monkeypatch):
    from monitoring.selectors import efficiency_for_jobs

    now = at("2025-04-01 00:30")
    monkeypatch.setattr("django.utils.timezone.now", lambda: now)
    account = services.account_open_for_project(project=lab["a"])
    services.reserved_plan_create(
        actor=None,
        account=account,
        gpu_model=lab["h100"],
        gpus=1,
        term_months=1,
        starts_at=at("2025-03-01 00:00"),
    )
    gpus = list(Gpu.objects.filter(model=lab["h100"]).order_by("pk"))
    covered = place(gpu=gpus[0], start=at("2025-03-03 10:00"), end=at("2025-03-03 13:00"))
    over = place(gpu=gpus[1], start=at("2025-03-03 10:00"), end=at("2025-03-03 11:20"))
    invoice = close(lab["a"], now=now)
    usage = selectors.usage_summary(project=lab["a"], period_start=MARCH, now=now).by_job
    figures = {}
    for alloc in (covered, over):
        job_page = selectors.job_cost(alloc.job, now=now)
        usage_page = next(j.amount for j in usage if j.job_id == alloc.job_id)
        efficiency = efficiency_for_jobs([alloc.job_id], since=None, now=now)[alloc.job_id].cost
        on_invoice = next(
            pricing.to_cents(row["cost"])
            for row in selectors.invoice_job_summary(invoice=invoice)
            if row["job_id"] == alloc.job_id
        )
        assert job_page == usage_page == efficiency == on_invoice
        figures[alloc.job_id] = job_page
    assert figures[covered.job_id] == 0 < figures[over.job_id]  # reserved coverage counts


def test_a_running_jobs_cost_is_the_same_on_every_page(lab, place, monkeypatch):
    from monitoring.selectors import efficiency_for_jobs

    now = at("2025-06-15 12:40")
    monkeypatch.setattr("django.utils.timezone.now", lambda: now)
    alloc = place(start=now - timedelta(hours=2))
    services.usage_meter(now=now)  # metered to 12:00; the open 40 minutes are estimated
    job_page = selectors.job_cost(alloc.job, now=now)
    usage_page = next(
        j.amount
        for j in selectors.usage_summary(
            project=lab["a"], period_start=pricing.period_of(now), now=now
        ).by_job
        if j.job_id == alloc.job_id
    )
    efficiency = efficiency_for_jobs([alloc.job_id], since=None, now=now)[alloc.job_id].cost
    assert job_page > 0 and job_page == usage_page == efficiency


def test_amounts_print_with_the_sign_before_the_currency():
    assert format_money(Decimal("-0.43")) == "\u2212$0.43"
    assert format_money(Decimal("1234.5")) == "$1,234.50"
    assert format_money(Decimal("0.004999")) == "$0.00"
    assert format_money(None) == ""
    rendered = Template("{{ a|money }} {{ b|money_negated }} {{ r|money:4 }}").render(
        Context({"a": Decimal("-0.43"), "b": Decimal("5"), "r": Decimal("2.5")})
    )
    assert rendered == "\u2212$0.43 \u2212$5.00 $2.5000"


def test_the_invoice_page_prints_negative_lines_with_a_minus(lab, place, client):
    place(start=at("2025-03-03 10:00"), end=at("2025-03-03 12:00"), end_reason="node_lost")
    place(start=at("2025-03-04 10:00"), end=at("2025-03-04 12:00"))
    invoice = close(lab["a"])
    client.force_login(lab["owner"])
    html = client.get(f"/billing/invoices/{invoice.pk}/").content.decode()
    assert "\u2212$" in html and "$-" not in html
