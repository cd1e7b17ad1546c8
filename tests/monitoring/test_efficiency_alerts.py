"""Alerts (fire once, notify, resolve) and efficiency (utilization, idle GPU-hours, cost)."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest
from django.core import mail

from monitoring.alerts import evaluate_alerts
from monitoring.ingest import ingest_samples
from monitoring.models import Alert, Notification
from monitoring.rollups import flush_rollups
from monitoring.selectors import efficiency_for_jobs
from scheduler.models import Job, JobState, Node
from tests.monitoring.conftest import feed, hold, sample

pytestmark = pytest.mark.django_db


def test_idle_allocation_alert_fires_once_tells_the_owner_and_resolves(fleet, now, make_user):
    operator = make_user(staff=True)
    gpu = fleet["nodes"]["h1"].gpus.first()
    job = hold(gpu, now=now, started=now - timedelta(minutes=45))
    feed(gpu.node, [gpu], start=now - timedelta(minutes=40), minutes=40, utilization=1.5)
    flush_rollups(now=now + timedelta(seconds=30))

    first = evaluate_alerts(now=now)
    assert [a.key for a in first.opened] == [f"idle_allocation:job:{job.pk}"]
    alert = Alert.objects.get(rule=Alert.Rule.IDLE_ALLOCATION)
    assert alert.job_id == job.pk and alert.project_id == job.project_id
    notes = Notification.objects.filter(alert=alert)
    assert [n.user_id for n in notes] == [job.submitted_by_id]  # the owner, not the operators
    assert not Notification.objects.filter(user=operator).exists()
    assert len(mail.outbox) == 0  # sent after commit
    # dedup: evaluating again keeps the one open alert and notifies nobody again
    second = evaluate_alerts(now=now + timedelta(minutes=1))
    assert second.opened == [] and second.still_open == 1
    assert Alert.objects.filter(rule=Alert.Rule.IDLE_ALLOCATION).count() == 1
    assert Notification.objects.count() == 1

    # the job gets to work: one busy minute in the window clears the condition
    feed(gpu.node, [gpu], start=now + timedelta(minutes=1), minutes=1, utilization=90.0)
    flush_rollups(now=now + timedelta(minutes=3))
    third = evaluate_alerts(now=now + timedelta(minutes=3))
    assert [a.pk for a in third.resolved] == [alert.pk]
    alert.refresh_from_db()
    assert alert.resolved_at == now + timedelta(minutes=3)
    assert not Alert.objects.filter(resolved_at__isnull=True).exists()


def test_idle_alert_email_goes_out_after_commit(fleet, now, django_capture_on_commit_callbacks):
    gpu = fleet["nodes"]["h1"].gpus.first()
    job = hold(gpu, now=now, started=now - timedelta(minutes=45))
    feed(gpu.node, [gpu], start=now - timedelta(minutes=35), minutes=35, utilization=0.0)
    flush_rollups(now=now + timedelta(seconds=30))
    with django_capture_on_commit_callbacks(execute=True):
        evaluate_alerts(now=now)
    assert len(mail.outbox) == 1
    assert mail.outbox[0].to == [job.submitted_by.email]
    assert f"Job #{job.pk}" in mail.outbox[0].body


def test_a_busy_or_young_job_is_not_idle(fleet, now):
    gpu, young_gpu = list(fleet["nodes"]["h1"].gpus.all())
    hold(gpu, now=now, started=now - timedelta(minutes=45))
    hold(young_gpu, now=now, started=now - timedelta(minutes=10))
    feed(gpu.node, [gpu], start=now - timedelta(minutes=40), minutes=40, utilization=6.0)
    feed(gpu.node, [young_gpu], start=now - timedelta(minutes=10), minutes=10, utilization=0.0)
    flush_rollups(now=now + timedelta(seconds=30))
    assert evaluate_alerts(now=now).opened == []


def test_device_and_fleet_rules(fleet, now, make_user, settings, team):
    make_user(staff=True)
    make_user(staff=True)
    h1 = fleet["nodes"]["h1"]
    hot, flaky = list(h1.gpus.all())
    ingest_samples(
        node=h1,
        samples=[
            sample(hot, temperature_c=91.0),
            sample(flaky, xid_events=[79], ecc_uncorrected=2),
        ],
        now=now,
    )
    Node.objects.filter(pk=fleet["nodes"]["h2"].pk).update(state=Node.State.LOST)
    settings.MONITORING_ALERT_QUEUE_WAIT_S = 600
    Job.objects.create(
        project=team["a"],
        submitted_by=team["member"],
        name="waits",
        command="true",
        state=JobState.QUEUED,
        gpu_model=fleet["l4"],
        queued_at=now - timedelta(hours=2),
    )
    opened = {a.rule: a for a in evaluate_alerts(now=now).opened}
    assert set(opened) == {"gpu_temperature", "xid", "ecc", "node_lost", "queue_wait"}
    assert opened["xid"].severity == "critical" and "XID 79" in opened["xid"].message
    assert "91" in opened["gpu_temperature"].message
    assert opened["queue_wait"].key == "queue_wait:model:L4"
    # operators are told: two staff users, five alerts
    assert Notification.objects.count() == 10
    # temperature clears only below the threshold minus the hysteresis; then it resolves
    ingest_samples(node=h1, samples=[sample(hot, temperature_c=84.0)], now=now)
    assert evaluate_alerts(now=now).resolved == []
    ingest_samples(node=h1, samples=[sample(hot, temperature_c=70.0)], now=now)
    resolved = evaluate_alerts(now=now).resolved
    assert [a.rule for a in resolved] == ["gpu_temperature"]
    # the XID ages out of its window
    later = evaluate_alerts(now=now + timedelta(seconds=settings.MONITORING_ALERT_XID_WINDOW_S + 1))
    assert "xid" in {a.rule for a in later.resolved}


def test_efficiency_weights_by_share_and_counts_idle_time(fleet, now):
    gpu = fleet["nodes"]["h1"].gpus.first()
    job = hold(gpu, now=now, started=now - timedelta(hours=2))
    # 20 busy minutes at 80 %, 20 idle minutes at 0 %
    feed(gpu.node, [gpu], start=now - timedelta(minutes=40), minutes=20, utilization=80.0)
    feed(gpu.node, [gpu], start=now - timedelta(minutes=20), minutes=20, utilization=0.0)
    flush_rollups(now=now + timedelta(minutes=1))
    eff = efficiency_for_jobs([job.pk], since=None, now=now)[job.pk]
    assert eff.gpu_hours == pytest.approx(2.0)
    assert eff.avg_util == pytest.approx(40.0)
    assert eff.idle_fraction == pytest.approx(0.5)
    assert eff.idle_gpu_hours == pytest.approx(1.0)
    rate = fleet["h100"].price_per_gpu_hour
    assert eff.cost == pytest.approx(rate * 2, abs=Decimal("0.01"))
    assert eff.idle_cost == pytest.approx(rate, abs=Decimal("0.01"))


def test_job_and_project_efficiency_api_are_scoped(running, api, team, now):
    gpu, job = running["gpu"], running["job"]
    feed(running["node"], [gpu], start=now - timedelta(minutes=5), minutes=3, utilization=70.0)
    flush_rollups(now=now)
    resp = api(team["viewer"]).get(f"/api/v1/monitoring/jobs/{job.pk}/efficiency")
    assert resp.status_code == 200 and resp.json()["avg_utilization"] == pytest.approx(70.0)
    assert (
        api(team["outsider"]).get(f"/api/v1/monitoring/jobs/{job.pk}/efficiency").status_code == 404
    )
    resp = api(team["member"]).get("/api/v1/monitoring/projects/alpha/efficiency?days=7")
    body = resp.json()
    assert resp.status_code == 200 and [j["id"] for j in body["jobs"]] == [job.pk]
    assert body["total"]["avg_utilization"] == pytest.approx(70.0)
    assert (
        api(team["outsider"]).get("/api/v1/monitoring/projects/alpha/efficiency").status_code == 404
    )
    bad = api(team["member"]).get("/api/v1/monitoring/projects/alpha/efficiency?days=abc")
    assert bad.status_code == 400 and "days" in bad.json()


def test_efficiency_pages(running, client, team, now):
    feed(running["node"], [running["gpu"]], start=now - timedelta(minutes=5), minutes=3)
    flush_rollups(now=now)
    client.force_login(team["member"])
    page = client.get("/monitoring/efficiency/alpha/")
    assert page.status_code == 200 and f"#{running['job'].pk}" in page.content.decode()
    assert client.get("/monitoring/efficiency/alpha/?days=0").status_code == 400
    part = client.get(f"/monitoring/jobs/{running['job'].pk}/efficiency/")
    assert part.status_code == 200 and "50.0 %" in part.content.decode()
    client.force_login(team["outsider"])
    assert client.get("/monitoring/efficiency/alpha/").status_code == 404
    assert client.get(f"/monitoring/jobs/{running['job'].pk}/efficiency/").status_code == 404


def test_cost_is_what_the_job_cost_port_answers(running, now):
    from monitoring.selectors import job_efficiency
    from scheduler import ports

    with ports.JOB_COST.override(fake_cost):
        assert job_efficiency(running["job"], now=now)[1] == Decimal("12.34")
    with ports.JOB_COST.override(failing_cost):  # billing failing does not break the page
        assert job_efficiency(running["job"], now=now)[1] is None


def fake_cost(job, *, now):
    return Decimal("12.34")


def failing_cost(job, *, now):
    raise RuntimeError("billing is down")
