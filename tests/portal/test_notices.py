"""Notices: e-mail when a job starts, ends, fails, is preempted or requeued, when a request is
decided and for budget thresholds, as each user chose; a project's webhook gets every notice,
signed, and a failed delivery is retried by the Celery worker."""

from __future__ import annotations

import json
import threading
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.core import mail

from portal import notify
from portal.models import AuditEvent, NoticeKind, ProjectWebhook, WebhookDelivery
from scheduler.admission import JobSpec, job_submit
from scheduler.job_notices import job_notices_send, notice_kind
from scheduler.models import JobState
from scheduler.transitions import job_transition
from tests.polling import wait_for


class Receiver:
    """A webhook receiver on loopback: answers the statuses given, in turn, then 200."""

    def __init__(self, statuses: list[int]) -> None:
        self.statuses = list(statuses)
        self.requests: list[tuple[dict[str, str], bytes]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                outer.requests.append((dict(self.headers), body))
                self.send_response(outer.statuses.pop(0) if outer.statuses else 200)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver():
    r = Receiver([500])
    yield r
    r.close()


def test_which_moves_send_which_notice():
    S = JobState
    assert notice_kind(S.STARTING, S.RUNNING) == NoticeKind.JOB_STARTED
    assert notice_kind(S.SCHEDULED, S.RUNNING) == NoticeKind.JOB_STARTED
    assert notice_kind(S.RUNNING, S.SUCCEEDED) == NoticeKind.JOB_SUCCEEDED
    assert notice_kind(S.RUNNING, S.FAILED) == NoticeKind.JOB_FAILED
    assert notice_kind(S.RUNNING, S.PREEMPTING) == NoticeKind.JOB_PREEMPTED
    assert notice_kind(S.PREEMPTING, S.QUEUED) == NoticeKind.JOB_REQUEUED
    assert notice_kind(S.LOST, S.QUEUED) == NoticeKind.JOB_REQUEUED
    assert notice_kind(S.PENDING, S.QUEUED) is None  # admission is not news
    assert notice_kind(S.QUEUED, S.SCHEDULED) is None
    assert notice_kind(S.RUNNING, S.CANCELLED) is None  # whoever cancelled knows


@pytest.mark.django_db
def test_job_notice_follows_the_submitters_preferences(
    team, fleet, django_capture_on_commit_callbacks
):
    member = team["member"]
    job = job_submit(actor=member, project=team["a"], spec=JobSpec(name="t", command="true"))[0]
    with django_capture_on_commit_callbacks(execute=True):
        assert job_notices_send(events=[(job.pk, NoticeKind.JOB_FAILED, "exit code 3")]) == 1
    assert [m.to for m in mail.outbox] == [[member.email]]
    assert mail.outbox[0].subject == f"[Alpha] Job #{job.pk} t failed"
    assert "Why: exit code 3" in mail.outbox[0].body

    notify.preferences_set(
        actor=member, email_kinds=[k for k in NoticeKind.values if k != NoticeKind.JOB_FAILED]
    )
    assert AuditEvent.objects.filter(action="portal.notifications.preferences").exists()
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        job_notices_send(events=[(job.pk, NoticeKind.JOB_FAILED, "again")])
        job_notices_send(events=[(job.pk, NoticeKind.JOB_STARTED, "")])
    assert [m.subject for m in mail.outbox] == [f"[Alpha] Job #{job.pk} t started"]


@pytest.mark.django_db
def test_request_decision_and_budget_threshold_go_through_notify(
    team, fleet, django_capture_on_commit_callbacks
):
    from billing.models import Budget
    from billing.services.budgets import _budget_alert
    from scheduler.quota_requests import quota_request_create, quota_request_decline

    owner, staff = team["owner"], team["outsider"]
    staff.is_staff = True
    staff.save()
    ProjectWebhook.objects.create(project=team["a"], url="http://127.0.0.1:9/", secret="s")
    notify.preferences_set(actor=owner, email_kinds=[NoticeKind.BUDGET_THRESHOLD])
    request = quota_request_create(actor=owner, project=team["a"], max_gpus=64, justification="x")
    with django_capture_on_commit_callbacks(execute=False):  # the webhook is not called here
        quota_request_decline(actor=staff, request_id=request.pk, reason="no room")
        budget = Budget.objects.create(project=team["a"], monthly_amount=Decimal("100"))
        _budget_alert(
            budget,
            period=budget.project.created_at.date(),
            thresholds=[50, 80],
            spent=Decimal("80"),
        )
    kinds = list(WebhookDelivery.objects.order_by("pk").values_list("kind", flat=True))
    assert kinds == [NoticeKind.REQUEST_DECIDED, NoticeKind.BUDGET_THRESHOLD]
    budget_payload = WebhookDelivery.objects.get(kind=NoticeKind.BUDGET_THRESHOLD).payload
    assert budget_payload["data"]["threshold"] == 80 and budget_payload["project"] == "alpha"
    decided = WebhookDelivery.objects.get(kind=NoticeKind.REQUEST_DECIDED).payload
    assert decided["data"]["status"] == "declined" and "no room" in decided["message"]


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_job_moves_mail_the_submitter_and_reach_the_signed_webhook_with_retries(
    team, fleet, celery_live_worker, receiver
):
    owner, member = team["owner"], team["member"]
    _webhook, secret = notify.webhook_set(actor=owner, project=team["a"], url=receiver.url)
    assert secret and secret.startswith("whsec_")
    job = job_submit(actor=member, project=team["a"], spec=JobSpec(name="t", command="true"))[0]
    for state in (JobState.SCHEDULED, JobState.RUNNING, JobState.FAILED):
        job_transition(job=job, to=state, reason=f"to {state}")

    wanted = {f"[Alpha] Job #{job.pk} t started", f"[Alpha] Job #{job.pk} t failed"}
    wait_for(lambda: {m.subject for m in mail.outbox} >= wanted, timeout=20)
    assert all(m.to == [member.email] for m in mail.outbox)

    # the first delivery is answered 500 and retried; both notices arrive, signed
    wait_for(lambda: WebhookDelivery.objects.filter(status="delivered").count() == 2, timeout=20)
    retried = WebhookDelivery.objects.get(attempts=2)  # the one answered 500 first
    assert retried.last_status_code == 200
    assert WebhookDelivery.objects.exclude(pk=retried.pk).get().attempts == 1
    assert len(receiver.requests) == 3
    kinds = []
    for headers, body in receiver.requests:
        assert notify.signature_valid(
            secret=secret, header=headers["X-GPUCloud-Signature"], body=body
        )
        assert not notify.signature_valid(
            secret="whsec_wrong", header=headers["X-GPUCloud-Signature"], body=body
        )
        kinds.append(json.loads(body)["kind"])
    assert sorted(kinds) == sorted(["job.started", "job.failed", retried.kind])
    ids = [headers["X-GPUCloud-Delivery"] for headers, _ in receiver.requests]
    assert ids.count(str(retried.pk)) == 2  # a retry is the same delivery


@pytest.mark.celery
@pytest.mark.django_db(transaction=True)
def test_a_webhook_that_keeps_failing_is_given_up_after_the_last_attempt(
    team, fleet, celery_live_worker, settings
):
    dead = Receiver([500, 502, 503, 504])
    try:
        notify.webhook_set(actor=team["owner"], project=team["a"], url=dead.url)
        job = job_submit(
            actor=team["member"], project=team["a"], spec=JobSpec(name="t", command="true")
        )[0]
        job_transition(job=job, to=JobState.SCHEDULED, reason="")
        job_transition(job=job, to=JobState.RUNNING, reason="")
        wait_for(lambda: WebhookDelivery.objects.filter(status="failed").exists(), timeout=20)
        delivery = WebhookDelivery.objects.get()
        assert delivery.attempts == settings.WEBHOOK_MAX_ATTEMPTS == 3
        assert delivery.last_error == "answered 503" and len(dead.requests) == 3
    finally:
        dead.close()


@pytest.mark.django_db
def test_preferences_page_and_webhook_page(client, team, settings):
    owner, member = team["owner"], team["member"]
    client.force_login(member)
    page = client.get("/account/notifications/").content.decode()
    assert page.count('type="checkbox"') == len(NoticeKind.values) and "checked" in page
    client.post("/account/notifications/", {"email": [NoticeKind.JOB_FAILED]})
    assert notify.preferences_of(member)[NoticeKind.JOB_FAILED] is True
    assert notify.preferences_of(member)[NoticeKind.JOB_STARTED] is False
    bad = client.post("/account/notifications/", {"email": ["job.exploded"]})
    assert "Unknown kind of notice" in bad.content.decode()

    assert client.get("/projects/alpha/webhook/").status_code == 403  # members: no
    client.force_login(owner)
    resp = client.post("/projects/alpha/webhook/", {"url": "https://hooks.example.org/x"})
    secret = ProjectWebhook.objects.get(project=team["a"]).secret
    assert secret in resp.content.decode()  # shown once
    assert secret not in client.get("/projects/alpha/webhook/").content.decode()
    assert AuditEvent.objects.filter(action="portal.webhook.set").exists()

    settings.WEBHOOK_ALLOW_PRIVATE_HOSTS = False
    for url in ("http://127.0.0.1:8000/", "http://10.1.2.3/", "ftp://example.org/"):
        resp = client.post("/projects/alpha/webhook/", {"url": url}, follow=True)
        assert "webhook URL" in resp.content.decode(), url
    assert ProjectWebhook.objects.get(project=team["a"]).url == "https://hooks.example.org/x"
    client.post("/projects/alpha/webhook/", {"remove": "1"})
    assert not ProjectWebhook.objects.exists()


@pytest.mark.django_db
def test_a_batch_of_job_notices_reads_preferences_and_webhooks_once(
    team, fleet, django_assert_num_queries, django_capture_on_commit_callbacks
):
    owner, member = team["owner"], team["member"]
    jobs = [
        job_submit(actor=who, project=team["a"], spec=JobSpec(name=f"t{i}", command="true"))[0]
        for i, who in enumerate([member, owner, member])
    ]
    webhook = ProjectWebhook.objects.create(
        project=team["a"], url="http://127.0.0.1:9/", secret="s"
    )
    notify.preferences_set(
        actor=owner, email_kinds=[k for k in NoticeKind.values if k != NoticeKind.JOB_STARTED]
    )
    events = [(job.pk, NoticeKind.JOB_STARTED, "Started on h1") for job in jobs]
    events.append((jobs[1].pk, NoticeKind.JOB_FAILED, "exit code 1"))
    mail.outbox.clear()
    # the jobs; a savepoint, the preferences, the webhooks; two statements per delivery
    # (the row, then its payload naming it) and the savepoint's release
    with (
        django_assert_num_queries(1 + 3 + 2 * len(events) + 1),
        django_capture_on_commit_callbacks(execute=False) as hooks,
    ):
        assert job_notices_send(events=events) == len(events)
    for hook in hooks:  # the mail goes after commit (the webhooks' deliveries are not run here)
        if hook.__module__ == "portal.mail":
            hook()
    # the owner turned "started" off, not "failed"; the member wants both
    assert sorted((m.to[0], m.subject) for m in mail.outbox) == sorted(
        [
            (member.email, f"[Alpha] Job #{jobs[0].pk} t0 started"),
            (member.email, f"[Alpha] Job #{jobs[2].pk} t2 started"),
            (owner.email, f"[Alpha] Job #{jobs[1].pk} t1 failed"),
        ]
    )
    payloads = [d.payload for d in WebhookDelivery.objects.filter(webhook=webhook).order_by("pk")]
    assert [(p["data"]["job"], p["kind"]) for p in payloads] == [(e[0], e[1]) for e in events]
    assert all(p["id"] and p["project"] == "alpha" for p in payloads)


@pytest.mark.django_db
def test_notices_of_many_transactions_wait_for_one_drain(
    team, fleet, django_capture_on_commit_callbacks
):
    from foundation.locks import lock_key, redis_client
    from scheduler.job_notices import NOTICES_QUEUED, NOTICES_REQUESTED, job_notices_drain

    member = team["member"]
    jobs = [
        job_submit(actor=member, project=team["a"], spec=JobSpec(name=f"n{i}", command="true"))[0]
        for i in range(3)
    ]
    client = redis_client()
    client.delete(lock_key(NOTICES_QUEUED), lock_key(NOTICES_REQUESTED))
    from django.conf import settings

    queue = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] + "default"
    messages = client.llen(queue)  # the worker's queue on the broker
    for job in jobs:  # three transactions, as three agents' syncs
        with django_capture_on_commit_callbacks(execute=True):
            job_transition(job=job, to=JobState.SCHEDULED, reason="")
            job_transition(job=job, to=JobState.RUNNING, reason=f"Started {job.name}")
    assert client.llen(queue) == messages + 1  # one drain asked for, not three tasks
    client.lpop(queue)  # (no worker here: the drain is run below as it would run it)
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):  # its mail goes after its commit
        assert job_notices_drain() == 3
    assert [m.subject for m in mail.outbox] == [
        f"[Alpha] Job #{job.pk} {job.name} started" for job in jobs
    ]
    assert all(
        f"Why: Started {job.name}" in m.body for job, m in zip(jobs, mail.outbox, strict=True)
    )
    assert client.llen(lock_key(NOTICES_QUEUED)) == 0
    assert job_notices_drain() == 0  # nothing sent twice


def test_without_the_notices_list_a_batch_goes_as_its_own_task(team, monkeypatch):
    """Redis refusing the list (down, restarting) must not fail the write that committed: the
    batch goes to the broker as its task's argument, as it does without Redis."""
    import base64
    import json

    import redis
    from django.conf import settings

    from foundation.locks import redis_client
    from scheduler import job_notices

    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5)
    monkeypatch.setattr(job_notices, "redis_client", lambda: dead)
    broker = redis_client()
    queue = settings.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"] + "default"
    before = broker.llen(queue)
    job_notices.job_notices_queue([[7, "job_started", "Started"]])
    assert broker.llen(queue) == before + 1
    message = json.loads(broker.lpop(queue))
    args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
    assert message["headers"]["task"] == job_notices.NOTICES_TASK
    assert args == [[[7, "job_started", "Started"]]]
