"""The agent↔portal wire contract (`agent/protocol.py`) against the agent API's serializers,
the assignments the portal builds and the OpenAPI schema: one contract, held on both sides."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from agent import protocol
from agent.runner import Assignment as AgentAssignment
from scheduler import nodes
from scheduler.agent_api import answers
from scheduler.agent_api import serializers as wire
from scheduler.models import Job

PAIRS: list[tuple[Any, type[serializers.Serializer]]] = [  # type: ignore[type-arg]
    (protocol.Register, wire.RegisterSerializer),
    (protocol.GpuInventory, wire.GpuInventorySerializer),
    (protocol.Heartbeat, wire.HeartbeatSerializer),
    (protocol.Telemetry, wire.TelemetrySerializer),
    (protocol.GpuProcess, wire.ProcessSerializer),
    (protocol.Running, wire.RunningSerializer),
    (protocol.Started, wire.StartedSerializer),
    (protocol.Exited, wire.ExitedSerializer),
    (protocol.Logs, wire.LogSerializer),
    (protocol.Sync, wire.SyncSerializer),
    (protocol.SyncReport, wire.SyncReportSerializer),
    (protocol.RegisterAnswer, answers.RegisterAnswer),
    (protocol.HeartbeatAnswer, answers.HeartbeatAnswer),
    (protocol.Assignment, answers.Assignment),
    (protocol.VolumeMount, answers.VolumeMount),
    (protocol.CheckpointPlace, answers.CheckpointPlace),
    (protocol.AssignmentsAnswer, answers.AssignmentsAnswer),
    (protocol.SyncResult, answers.SyncResult),
    (protocol.SyncAnswer, answers.SyncAnswer),
    (protocol.StateAnswer, answers.StateAnswer),
    (protocol.LogsAnswer, answers.LogsAnswer),
]


def fields(serializer_class: type[serializers.Serializer]) -> tuple[set[str], set[str]]:  # type: ignore[type-arg]
    found = serializer_class().fields
    return set(found), {name for name, f in found.items() if f.required}


@pytest.mark.parametrize(("message", "serializer"), PAIRS, ids=lambda x: x.__name__)
def test_each_message_has_the_serializers_fields_and_required_ones(message, serializer):
    names, required = fields(serializer)
    assert set(message.__annotations__) == names
    assert set(message.__required_keys__) == required


def test_the_schema_only_sync_reports_are_a_started_and_an_exited_report():
    started, _ = fields(wire.SyncStartedReport)
    exited, _ = fields(wire.SyncExitedReport)
    assert started == set(protocol.Started.__annotations__) | {"kind", "job_id"}
    assert exited == set(protocol.Exited.__annotations__) | {"kind", "job_id"}
    assert started | exited == set(protocol.SyncReport.__annotations__)


def test_exit_reasons_and_log_streams_are_the_protocols():
    assert list(wire.ExitedSerializer().fields["reason"].choices) == list(protocol.EXIT_REASONS)
    assert list(wire.SyncReportSerializer().fields["reason"].choices) == list(protocol.EXIT_REASONS)
    assert list(wire.LogSerializer().fields["stream"].choices) == list(protocol.LOG_STREAMS)
    assert set(protocol.FAILURE_TEXT) <= set(protocol.EXIT_REASONS)


@pytest.mark.django_db
def test_the_assignments_the_portal_builds_are_what_the_agent_reads(placed):
    job = placed["job"]
    Job.objects.filter(pk=job.pk).update(
        image="registry.example/train:1",
        time_limit_s=600,
        cpu_milli=8000,
        memory_mib=4096,
        shm_mib=2048,
    )
    [sent] = nodes.assignments_for(placed["node"])
    assert set(sent) == set(protocol.Assignment.__annotations__)
    assert set(sent["env"]) <= protocol.PLATFORM_ENV  # the job asked for no variables
    parsed = AgentAssignment.from_dict(sent)
    assert (parsed.image, parsed.time_limit_s) == ("registry.example/train:1", 600)
    assert (parsed.cpu_milli, parsed.memory_mib, parsed.shm_mib) == (8000, 4096, 2048)
    assert parsed.job_id == job.pk and parsed.gpu_uuids


@pytest.mark.django_db
def test_the_openapi_schema_declares_the_agent_api_answers(make_user, client):
    client.force_login(make_user())
    schema = client.get("/api/schema/?format=json").json()
    paths = {p: v for p, v in schema["paths"].items() if p.startswith(protocol.API_PREFIX)}
    assert paths
    for path, operations in paths.items():
        for method, op in operations.items():
            ok = {s: a for s, a in op["responses"].items() if s.startswith("2")}
            assert ok, (path, method)
            for status, answer in ok.items():
                ref = answer["content"]["application/json"]["schema"].get("$ref", "")
                assert ref.startswith("#/components/schemas/"), (path, method, status)
    components = schema["components"]["schemas"]
    assignment = components["Assignment"]["properties"]
    assert set(assignment) == set(protocol.Assignment.__annotations__)
