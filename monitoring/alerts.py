"""Alert rules and their evaluation: fire once per subject, notify, resolve when it clears.

Rules read the live store (temperature, ECC, XID), the fleet (lost nodes, the queue) and the
1-minute rollups (idle allocations). `evaluate_alerts` compares what fires now with the open
alerts: new keys open an alert and notify (in-app and email) once, keys still firing are
touched, open keys no longer firing are resolved. A partial unique constraint keeps one open
alert per key even if two evaluations race.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.mail import send_mass_mail
from django.db import transaction
from django.db.models import Count, Max, Min
from django.db.models.functions import Coalesce
from django.urls import reverse

from monitoring import live
from monitoring.models import Alert, GpuRollup, Notification, Resolution
from portal.models import User
from scheduler.gpu_health_rules import GPU_FATAL_XIDS
from scheduler.models import Allocation, Gpu, Job, JobState, Node

TEMP_HYSTERESIS_C = 3.0  # an open temperature alert clears only this far below the threshold
IDLE_COVERAGE = 0.7  # share of the idle window that must have samples to call a job idle


@dataclass
class Firing:
    rule: str
    key: str
    severity: str
    message: str
    node_id: int | None = None
    gpu_id: int | None = None
    job_id: int | None = None
    project_id: int | None = None
    owner_id: int | None = None  # None: the operators are told
    url: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def _gpu_rows() -> dict[int, tuple[int, int, str]]:
    """gpu_id → (index, node_id, node name) for GPUs of live nodes."""
    rows = Gpu.objects.exclude(node__state=Node.State.RETIRED).values_list(
        "pk", "index", "node_id", "node__name"
    )
    return {pk: (index, node_id, name) for pk, index, node_id, name in rows}


def device_rules(*, now: datetime, open_keys: set[str]) -> list[Firing]:
    """Temperature, ECC/row remap and XID, from the live store."""
    gpus = _gpu_rows()
    latest = live.latest(gpus)
    threshold = float(settings.MONITORING_ALERT_TEMP_C)
    out = []
    for gpu_id, sample in latest.items():
        index, node_id, node = gpus[gpu_id]
        where = f"GPU {index} on {node}"
        url = reverse("ops-node-detail", args=[node_id])
        temp = sample.get("temperature_c")
        key = f"gpu_temperature:gpu:{gpu_id}"
        limit = threshold - TEMP_HYSTERESIS_C if key in open_keys else threshold
        if temp is not None and temp >= limit:
            out.append(
                Firing(
                    Alert.Rule.GPU_TEMPERATURE,
                    key,
                    Alert.Severity.WARNING,
                    f"{where} is at {temp:.0f} °C (alert at {threshold:.0f} °C)",
                    node_id=node_id,
                    gpu_id=gpu_id,
                    url=url,
                    data={"temperature_c": temp},
                )
            )
        ecc = sample.get("ecc_uncorrected") or 0
        if ecc > 0 or sample.get("row_remap_pending"):
            what = f"{ecc} uncorrected ECC errors" if ecc else "a pending row remap"
            out.append(
                Firing(
                    Alert.Rule.ECC,
                    f"ecc:gpu:{gpu_id}",
                    Alert.Severity.CRITICAL,
                    f"{where} reports {what}",
                    node_id=node_id,
                    gpu_id=gpu_id,
                    url=url,
                    data={"ecc_uncorrected": ecc},
                )
            )
    window = float(settings.MONITORING_ALERT_XID_WINDOW_S)
    for gpu_id, (xid, at) in live.last_xids().items():
        if gpu_id not in gpus or now.timestamp() - at > window:
            continue
        index, node_id, node = gpus[gpu_id]
        fatal = xid in GPU_FATAL_XIDS
        out.append(
            Firing(
                Alert.Rule.XID,
                f"xid:gpu:{gpu_id}",
                Alert.Severity.CRITICAL if fatal else Alert.Severity.WARNING,
                f"XID {xid} on GPU {index} of {node}"
                + (" (the GPU needs attention)" if fatal else " (an application fault)"),
                node_id=node_id,
                gpu_id=gpu_id,
                url=reverse("ops-node-detail", args=[node_id]),
                data={"xid": xid, "at": at},
            )
        )
    return out


def fleet_rules(*, now: datetime) -> list[Firing]:
    """Lost nodes and queues waiting too long."""
    out = []
    for node_id, name, last in Node.objects.filter(state=Node.State.LOST).values_list(
        "pk", "name", "last_heartbeat_at"
    ):
        since = f" since {last:%Y-%m-%d %H:%M} UTC" if last else ""
        out.append(
            Firing(
                Alert.Rule.NODE_LOST,
                f"node_lost:node:{node_id}",
                Alert.Severity.CRITICAL,
                f"Node {name} is lost (no heartbeat{since})",
                node_id=node_id,
                url=reverse("ops-node-detail", args=[node_id]),
            )
        )
    limit = int(settings.MONITORING_ALERT_QUEUE_WAIT_S)
    waits = (
        Job.objects.filter(state=JobState.QUEUED)
        .values("gpu_model__name")
        .annotate(oldest=Min(Coalesce("queued_at", "created_at")), jobs=Count("pk"))
    )
    for row in waits:
        waited = (now - row["oldest"]).total_seconds()
        if waited < limit:
            continue
        model = row["gpu_model__name"] or "any"
        out.append(
            Firing(
                Alert.Rule.QUEUE_WAIT,
                f"queue_wait:model:{model}",
                Alert.Severity.WARNING,
                f"{row['jobs']} job(s) queued for {model}; the oldest has waited "
                f"{waited / 3600:.1f} h (alert after {limit / 3600:.1f} h)",
                url=reverse("monitoring:cluster"),
                data={"model": model, "oldest_wait_s": int(waited), "jobs": row["jobs"]},
            )
        )
    return out


def idle_rules(*, now: datetime) -> list[Firing]:
    """Running jobs whose every GPU stayed under the idle threshold for the whole window."""
    minutes = int(settings.MONITORING_IDLE_MINUTES)
    below = float(settings.MONITORING_IDLE_UTIL_PCT)
    start = now - timedelta(minutes=minutes)
    held = (
        Allocation.objects.filter(ended_at__isnull=True, job__state=JobState.RUNNING)
        .values("job_id")
        .annotate(latest_start=Max("started_at"), gpus=Count("gpu_id"))
        .filter(latest_start__lte=start)
    )
    gpus_of = {row["job_id"]: row["gpus"] for row in held}
    if not gpus_of:
        return []
    stats = (
        GpuRollup.objects.filter(
            resolution=Resolution.MINUTE, held_by_job__in=list(gpus_of), bucket__gte=start
        )
        .values("held_by_job")
        .annotate(minutes=Count("bucket", distinct=True), peak=Max("util_avg"))
    )
    need = math.ceil(minutes * IDLE_COVERAGE)
    idle = {
        row["held_by_job"]: row["peak"]
        for row in stats
        if row["minutes"] >= need and row["peak"] < below
    }
    out = []
    for job in Job.objects.filter(pk__in=list(idle)).select_related("project"):
        n = gpus_of[job.pk]
        out.append(
            Firing(
                Alert.Rule.IDLE_ALLOCATION,
                f"idle_allocation:job:{job.pk}",
                Alert.Severity.WARNING,
                f"Job #{job.pk} {job.name} holds {n} GPU(s) that stayed under {below:.0f}% "
                f"utilization for {minutes} minutes (peak {idle[job.pk]:.1f}%). They are "
                "billed while idle: cancel the job or check that it uses the GPU.",
                job_id=job.pk,
                project_id=job.project_id,
                owner_id=job.submitted_by_id,
                url=reverse("job-detail", args=[job.pk]),
                data={"gpus": n, "peak_util": round(idle[job.pk], 2)},
            )
        )
    return out


@dataclass
class Evaluation:
    opened: list[Alert]
    still_open: int
    resolved: list[Alert]


@transaction.atomic
def evaluate_alerts(*, now: datetime) -> Evaluation:
    """Open, touch and resolve alerts against what fires now; notify for new ones only."""
    current = {a.key: a for a in Alert.objects.select_for_update().filter(resolved_at__isnull=True)}
    firing: dict[str, Firing] = {}
    for f in [
        *device_rules(now=now, open_keys=set(current)),
        *fleet_rules(now=now),
        *idle_rules(now=now),
    ]:
        firing.setdefault(f.key, f)
    opened: list[Alert] = []
    touched: list[Alert] = []
    for key, f in firing.items():
        alert = current.get(key)
        if alert is not None:
            alert.last_seen_at, alert.message, alert.severity = now, f.message[:500], f.severity
            touched.append(alert)
            continue
        opened.append(
            Alert(
                rule=f.rule,
                key=key,
                severity=f.severity,
                message=f.message[:500],
                node_id=f.node_id,
                gpu_id=f.gpu_id,
                job_id=f.job_id,
                project_id=f.project_id,
                data={**f.data, "url": f.url, "owner_id": f.owner_id},
                opened_at=now,
                last_seen_at=now,
            )
        )
    Alert.objects.bulk_update(touched, ["last_seen_at", "message", "severity"])
    resolved = [a for key, a in current.items() if key not in firing]
    for a in resolved:
        a.resolved_at = now
    Alert.objects.bulk_update(resolved, ["resolved_at"])
    opened = Alert.objects.bulk_create(opened)
    _notify(opened, now=now)
    return Evaluation(opened, len(touched), resolved)


def _notify(alerts: list[Alert], *, now: datetime) -> None:
    """In-app notifications now, emails after commit: the owner for their job, else operators."""
    if not alerts:
        return
    staff = list(User.objects.filter(is_staff=True, is_active=True).values_list("pk", "email"))
    owners = {a.data.get("owner_id") for a in alerts} - {None}
    emails = dict(User.objects.filter(pk__in=owners).values_list("pk", "email"))
    notes, mails = [], []
    for a in alerts:
        owner = a.data.get("owner_id")
        recipients = [(owner, emails.get(owner, ""))] if owner else staff
        title = f"{a.get_rule_display()}: {a.get_severity_display().lower()}"
        for user_id, email in recipients:
            notes.append(
                Notification(
                    user_id=user_id,
                    alert=a,
                    title=title,
                    body=a.message,
                    url=a.data.get("url", ""),
                    created_at=now,
                )
            )
            if email and settings.MONITORING_ALERT_EMAIL:
                mails.append(
                    (f"[GPU Cloud] {title}", a.message, settings.DEFAULT_FROM_EMAIL, [email])
                )
    Notification.objects.bulk_create(notes)
    if mails:
        transaction.on_commit(lambda: send_mass_mail(tuple(mails), fail_silently=True))
