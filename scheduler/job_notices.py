"""Job notices: what a job's submitter (and its project's webhook) is told of: the job started,
ended, failed, was preempted or requeued. `portal/notify.py` sends every notice (e-mail and
webhook); this module says which job moves make one and batches them. The state machine
(`transitions.py`) names the moves; the notices go out from a Celery task after the commit, so
no transition waits on mail or HTTP."""

from __future__ import annotations

import time
from collections.abc import Sequence

import orjson
import redis
from django.conf import settings
from django.db import transaction

from foundation.enqueue import enqueue, task_named
from foundation.locks import lock_key, redis_client, single_flight
from portal.models import NoticeKind
from portal.notify import Notice, notify_all
from scheduler.models import Job
from scheduler.models import JobState as S

REQUEUED_FROM = frozenset({S.RUNNING, S.LOST, S.PREEMPTING, S.STARTING, S.SCHEDULED})


def notice_kind(current: str, to: str) -> str | None:
    """The notice a move from `current` to `to` sends, if any."""
    if to == S.RUNNING and current != S.RUNNING:
        return NoticeKind.JOB_STARTED
    if to == S.SUCCEEDED:
        return NoticeKind.JOB_SUCCEEDED
    if to == S.FAILED:
        return NoticeKind.JOB_FAILED
    if to == S.PREEMPTING:
        return NoticeKind.JOB_PREEMPTED
    if to == S.QUEUED and current in REQUEUED_FROM:
        return NoticeKind.JOB_REQUEUED
    return None


NOTICES_TASK = "scheduler.job_notices"
# With Redis, the batches wait on a list and one task message drains however many arrived
# meanwhile (as cycle requests coalesce): a message costs the web process its publish and the
# worker its consumer's work (`bench.worker_redis`), and agents' syncs start jobs a few at a
# time. Without Redis (the embedded default) each batch is its own task's argument.
NOTICES_QUEUED = "scheduler:job-notices"
NOTICES_REQUESTED = "scheduler:job-notices-requested"
NOTICES_REQUEST_TTL_S = 5  # a drain asked for and lost is asked for again after this
NOTICES_RETRY_SECONDS = 0.25  # a drain that found another running tries again this much later
NOTICES_DRAIN_CHUNK = 100  # batches sent per read of the list
NOTICES_DRAIN_MAX_S = 20  # well inside the task's time limit


def job_notices_after_commit(events: Sequence[tuple[int, str, str]]) -> None:
    """Queue `(job id, kind, reason)` notices once the transaction commits."""
    if events:
        payload = [list(e) for e in events]
        transaction.on_commit(lambda: job_notices_queue(payload))


def job_notices_queue(payload: list[list[object]]) -> None:
    """Queue one batch: onto the Redis list, asking for a drain only where none is asked for
    yet (one round trip), or as a task of its own without Redis."""
    if not settings.REDIS_URL:
        enqueue(NOTICES_TASK, payload)
        return
    pipe = redis_client().pipeline(transaction=False)
    pipe.rpush(lock_key(NOTICES_QUEUED), orjson.dumps(payload))
    pipe.set(lock_key(NOTICES_REQUESTED), 1, nx=True, ex=NOTICES_REQUEST_TTL_S)
    try:
        _, requested = pipe.execute()
    except redis.RedisError:  # the batch as its own task's argument, as without Redis
        enqueue(NOTICES_TASK, payload)
        return
    if requested:
        enqueue(NOTICES_TASK)


def job_notices_drain() -> int:
    """Send every queued batch (the drain task, single-flight); returns how many were sent.

    The drain stays asked for while it runs, so batches queued meanwhile send no message; it
    drops the request only once the list is empty, then looks once more (a batch queued just
    before the drop asked for nothing). A batch is taken off the list once sent, or once
    sending it failed (as a failed task's notices were dropped); if the worker dies meanwhile
    it stays for the next drain.
    """
    client = redis_client()
    queued, requested = lock_key(NOTICES_QUEUED), lock_key(NOTICES_REQUESTED)
    sent = 0
    with single_flight("job-notices", ttl=65) as acquired:
        if not acquired:
            # The drain running now may be past its last look at the list: try again after it.
            task_named(NOTICES_TASK).apply_async(countdown=NOTICES_RETRY_SECONDS)
            return 0
        until = time.monotonic() + NOTICES_DRAIN_MAX_S
        while True:
            raw = client.lrange(queued, 0, NOTICES_DRAIN_CHUNK - 1)
            if not raw:
                client.delete(requested)
                if client.llen(queued):
                    continue
                return sent
            try:
                sent += job_notices_send(events=[e for b in raw for e in orjson.loads(b)])
            finally:
                client.ltrim(queued, len(raw), -1)
            client.expire(requested, NOTICES_REQUEST_TTL_S)
            if time.monotonic() > until:  # a backlog: the rest in a message of its own
                task_named(NOTICES_TASK).apply_async()
                return sent


SUBJECTS = {
    NoticeKind.JOB_STARTED: "Job #{pk} {name} started",
    NoticeKind.JOB_SUCCEEDED: "Job #{pk} {name} succeeded",
    NoticeKind.JOB_FAILED: "Job #{pk} {name} failed",
    NoticeKind.JOB_PREEMPTED: "Job #{pk} {name} is being preempted",
    NoticeKind.JOB_REQUEUED: "Job #{pk} {name} was requeued",
}


def job_notices_send(*, events: Sequence[Sequence[object]]) -> int:
    """Tell each job's submitter (and its project's webhook); returns how many were sent.

    A batch (the moves of one transaction) is one read of its jobs and one `notify_all`: one
    read of the e-mail preferences and one of the webhooks, whatever its size.
    """
    by_id = {
        job.pk: job
        for job in Job.objects.filter(pk__in=[e[0] for e in events])
        .select_related("project", "submitted_by")
        .only(
            "name",
            "state",
            "exit_code",
            "project__name",
            "project__slug",
            "submitted_by__email",
        )
    }
    notices = []
    for job_id, kind, reason in events:
        job = by_id.get(int(job_id))  # type: ignore[call-overload]
        if job is None:
            continue
        what = SUBJECTS[str(kind)].format(pk=job.pk, name=job.name)  # type: ignore[index]
        lines = [f"{what}.", f"Project: {job.project.name}"]
        if reason:
            lines.append(f"Why: {reason}")
        if job.exit_code is not None and kind == NoticeKind.JOB_FAILED:
            lines.append(f"Exit code: {job.exit_code}")
        notices.append(
            Notice(
                kind=str(kind),
                project=job.project,
                subject=f"[{job.project.name}] {what}",
                message="\n".join(lines),
                to=(job.submitted_by.email,),
                data={"job": job.pk, "name": job.name, "state": job.state, "reason": reason},
            )
        )
    with transaction.atomic():
        notify_all(notices)
    return len(notices)
