"""Schemathesis against the running server's OpenAPI schema: every operation, every check.

The server is pytest-django's live_server (PostgreSQL, the real URL conf and middleware); the
API calls carry a Bearer token of a member of project `alpha`, the agent endpoints a node token.
Each operation gets a few positive (schema-valid) and negative (schema-invalid) examples,
derandomized so CI sees the same cases every run. Every check Schemathesis has is on: no server
error, responses conform to the schema (status codes, content types, headers, bodies), invalid
data is rejected, valid data is not refused with a 400, and the auth the schema states is real.
"""

from __future__ import annotations

import uuid

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (
    negative_data_rejection,
    positive_data_acceptance,
)

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = {GenerationMode.POSITIVE: 12, GenerationMode.NEGATIVE: 8}

# Rules that depend on data or on several fields at once, which OpenAPI cannot state: for these
# operations a schema-valid request may still get a 400 naming the rule, so only the
# "valid data is accepted" check is off (every other check, and no-5xx, still applies).
SEMANTIC_400 = {
    ("POST", "/api/agent/v1/register"): "GPU products must be in the catalog (data)",
    ("POST", "/api/v1/jobs/"): "shape rules across fields (fraction × count, gang, elastic)",
    ("POST", "/api/v1/jobs/dry-run/"): "the same rules as submitting",
    (
        "POST",
        "/api/v1/jobs/{id}/resubmit/",
    ): "the same rules as submitting, over the job's own spec",
    ("POST", "/api/v1/jobs/manifest/"): "a Kubernetes Job: the server reads the fields it knows",
    (
        "POST",
        "/api/v1/projects/{project_slug}/volumes/",
    ): "kinds across fields (a dataset is shared, only node-local names a node), the quota (data)",
    (
        "POST",
        "/api/v1/projects/{project_slug}/volumes/{name}/upload/",
    ): "the dataset's limit and state (data)",
    (
        "PATCH",
        "/api/v1/projects/{project_slug}/volumes/{name}/upload/",
    ): "the Upload-Offset the server reported (data)",
    ("POST", "/api/v1/storage/requests/{request_id}/decide"): "a decline needs a reason",
}
# A manifest's body is documented as a string: the OpenAPI schema cannot say which YAML texts are
# Jobs (the server checks them against the Kubernetes schema). Its fuzzing is in test_fuzz_inputs.
LENIENT = {("POST", "/api/v1/jobs/manifest/")}


@pytest.fixture
def target(live_server, team, fleet):
    from portal.models import ApiToken
    from portal.services import token_create
    from scheduler.admission import JobSpec, job_submit

    issued = token_create(user=team["member"], name="schemathesis")
    job = job_submit(
        actor=team["member"], project=team["a"], spec=JobSpec(name="st", command="true")
    )[0]

    def keep_token() -> None:
        # A generated DELETE /tokens/{id} may hit our own token; the next case needs it again.
        ApiToken.objects.filter(pk=issued.token.pk).update(revoked_at=None)

    return {
        "url": live_server.url,
        "user": f"Bearer {issued.secret}",
        "node": f"Bearer {fleet['tokens']['h1']}",
        "keep_token": keep_token,
        "job": job,
    }


def test_every_operation_passes_every_check(target):
    schema = schemathesis.openapi.from_url(f"{target['url']}/api/schema/?format=json")
    schema.config.base_url = target["url"]
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 40, "the schema lists too few operations to be the real one"
    for operation in operations:
        is_agent = operation.path.startswith("/api/agent/")
        headers = {"Authorization": target["node"] if is_agent else target["user"]}
        key = (operation.method.upper(), operation.path)
        excluded = [positive_data_acceptance] if key in SEMANTIC_400 else []
        if key in LENIENT:
            excluded.append(negative_data_rejection)
        for mode, count in EXAMPLES.items():
            failures += _run(operation, mode, count, headers, target, excluded)
    assert not failures, f"{len(failures)} failing operations:\n\n" + "\n\n".join(failures)


def _own_idempotency_key(case):
    case.headers = {**(case.headers or {}), "Idempotency-Key": uuid.uuid4().hex}
    return case


def _run(operation, mode, count, headers, target, excluded) -> list[str]:
    strategy = operation.as_strategy(generation_mode=mode)
    if mode == GenerationMode.POSITIVE and operation.method.upper() == "POST":
        # The generator reuses simple keys ("0") across cases, and one key sent with another
        # request is rightly a 422: each valid case gets a key of its own. (Mapped here, not in
        # `check`, whose source seeds the derandomized examples.)
        strategy = strategy.map(_own_idempotency_key)
    label = f"{operation.method.upper()} {operation.path} ({mode.value})"

    @given(case=strategy)
    @settings(
        max_examples=count,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def check(case) -> None:
        target["keep_token"]()
        case.call_and_validate(
            base_url=target["url"], headers=headers, excluded_checks=excluded, timeout=30
        )

    try:
        check()
    except (Exception, BaseExceptionGroup) as exc:  # one report per operation; the rest run
        text = str(exc).strip()
        return [f"{label}\n{text[:3000]}"]
    return []
