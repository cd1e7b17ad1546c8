"""What a job's submitter (and its project's webhook) is told of: the job started, ended,
failed, was preempted or requeued. The state machine (`transitions.py`) names the moves; the
notices go out from a Celery task after the commit, so no transition waits on mail or HTTP."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction

from portal.enqueue import enqueue
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


def job_notices_after_commit(events: Sequence[tuple[int, str, str]]) -> None:
    """Queue `(job id, kind, reason)` notices once the transaction commits."""
    if events:
        payload = [list(e) for e in events]
        transaction.on_commit(lambda: enqueue("scheduler.job_notices", payload))


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
