"""Templates and resubmission: a job's request, saved to submit again, cloned or edited.

A job's request is kept as the body `POST /api/v1/jobs` takes (`job_request_body`): the API
resubmits it with the caller's changes on top, and the form starts from it (`form_initial`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import IntegrityError, transaction

from portal.audit import audit_record
from portal.errors import Conflict, DomainError, NotFound
from portal.models import Project, Role, User
from portal.selectors import project_list_visible_to
from portal.services import require_role
from scheduler.job_request import Surface, carried_on
from scheduler.job_volumes import volume_mount_text
from scheduler.models import Job, JobTemplate, PriorityClass


def _name_of(row: Any) -> str | None:
    return row.name if row is not None else None


# How a job's column becomes the body's value, by the declared kind (`scheduler.job_request`);
# a kind not listed is copied as it is.
BODY_MAPPERS: dict[str, Callable[[Any], Any]] = {
    "str_list": lambda value: list(value or []),
    "str_map": lambda value: dict(value or {}),
    "priority": lambda value: PriorityClass(value).name.lower(),
    "gpu_model": _name_of,
    "pool": _name_of,
    "volumes": lambda value: [dict(m) for m in value or []],
}


def job_request_body(job: Job) -> dict[str, Any]:
    """What was asked for, as the submit API takes it (an array shard: the whole array)."""
    body: dict[str, Any] = {
        f.name: BODY_MAPPERS.get(f.kind, lambda value: value)(getattr(job, str(f.model)))
        for f in carried_on(Surface.TEMPLATE)
    }
    body["shard_count"] = job.shard_count or 1  # a single job's row has none
    if job.shard_count and job.shard_count > 1 and job.name.endswith(f"[{job.shard_index}]"):
        body["name"] = job.name[: -len(f"[{job.shard_index}]")]
    return body


def form_initial(body: dict[str, Any], *, project_slug: str) -> dict[str, Any]:
    """The job form's initial values for a request body."""
    if body.get("nodes"):
        shape = "gang"
    elif (body.get("gpu_milli") or 1000) < 1000:
        shape = "fraction"
    else:
        shape = "whole"
    initial = {
        k: v for k, v in body.items() if k not in ("runtime_estimate_s", "time_limit_s", "env")
    }
    initial["project"] = project_slug
    initial["shape"] = shape
    initial["priority"] = PriorityClass[str(body.get("priority", "normal")).upper()].value
    if shape != "fraction":
        initial.pop("gpu_milli", None)
        initial.pop("gpu_memory_mib", None)
    for seconds, hours in (
        ("runtime_estimate_s", "runtime_estimate_h"),
        ("time_limit_s", "time_limit_h"),
    ):
        if body.get(seconds):
            initial[hours] = round(body[seconds] / 3600, 2)
    initial["env"] = "\n".join(f"{k}={v}" for k, v in (body.get("env") or {}).items())
    initial["volumes"] = "\n".join(volume_mount_text(m) for m in body.get("volumes") or [])
    return initial


def job_template_list_visible_to(*, user: User) -> Any:
    return JobTemplate.objects.filter(
        project__in=project_list_visible_to(user=user)
    ).select_related("project", "created_by")


def job_template_get_visible(*, user: User, template_id: int) -> JobTemplate:
    template = job_template_list_visible_to(user=user).filter(pk=template_id).first()
    if template is None:
        raise NotFound("No such template.")
    return template


@transaction.atomic
def job_template_create(
    *, actor: User, job: Job, name: str, remote_addr: str | None = None
) -> JobTemplate:
    """Save `job`'s request as a template of its project (owners and members)."""
    require_role(user=actor, project=job.project, roles=(Role.OWNER, Role.MEMBER))
    name = name.strip()
    if not name or len(name) > 100:
        raise DomainError("Name the template (at most 100 characters).", field="name")
    try:
        with transaction.atomic():
            template = JobTemplate.objects.create(
                project=job.project,
                created_by=actor,
                name=name,
                body=job_request_body(job),
                source_job=job,
            )
    except IntegrityError:
        raise Conflict(
            f"{job.project.name} already has a template named '{name}'.", code="duplicate"
        ) from None
    audit_record(
        actor=actor,
        action="scheduler.job_template.create",
        target=template,
        project=job.project,
        data={"name": name, "job": job.pk},
        remote_addr=remote_addr,
    )
    return template


@transaction.atomic
def job_template_delete(
    *, actor: User, template: JobTemplate, remote_addr: str | None = None
) -> None:
    require_role(user=actor, project=template.project, roles=(Role.OWNER, Role.MEMBER))
    audit_record(
        actor=actor,
        action="scheduler.job_template.delete",
        target=template,
        project=template.project,
        data={"name": template.name},
        remote_addr=remote_addr,
    )
    template.delete()


def resubmit_body(base: dict[str, Any], changes: dict[str, Any], *, project: Project) -> dict:
    """The body to submit: `base` with `changes` on top, in `project` unless changed."""
    body = {**base, **changes}
    body.setdefault("project", project.slug)
    if "project" not in changes:
        body["project"] = project.slug
    return {k: v for k, v in body.items() if v is not None}
