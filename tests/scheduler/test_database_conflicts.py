"""A request that meets a conflicting transaction in PostgreSQL (a deadlock, a serialization
failure, a lock it cannot have in time) is rolled back whole and answered 503 with Retry-After,
never 500: the agents retry after it, and nothing half-done is kept."""

from __future__ import annotations

import psycopg
import pytest
from django.db import connection
from rest_framework.test import APIClient

from portal.models import AuditEvent
from scheduler.models import Node

pytestmark = pytest.mark.django_db(transaction=True)

REGISTER = "/api/agent/v1/register"


def _inventory(node: Node) -> dict:
    return {
        "hostname": node.name,
        "cpu_milli": 64_000,
        "memory_mib": 512_000,
        "gpus": [
            {"index": g.index, "uuid": g.uuid, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
            for g in node.gpus.order_by("index")
        ],
    }


def test_a_registration_that_cannot_lock_its_node_in_time_answers_503_and_saves_nothing(fleet):
    node = fleet["nodes"]["h1"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {fleet['tokens']['h1']}")
    settings = connection.settings_dict
    # Another transaction (the cycle, an operator's drain) holds the node's row.
    holder = psycopg.connect(
        host=settings["HOST"] or None,
        port=settings["PORT"] or None,
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        dbname=settings["NAME"],
    )
    try:
        holder.execute("SELECT 1 FROM scheduler_node WHERE id = %s FOR UPDATE", [node.pk])
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = '200ms'")  # this test's request gives up fast
        audits = AuditEvent.objects.filter(action="node.register").count()

        resp = client.post(REGISTER, _inventory(node), format="json")

        assert resp.status_code == 503, resp.content
        assert resp["Retry-After"] == "1"
        assert resp.json()["code"] == "retry"
        assert "nothing was saved" in resp.json()["message"]
        assert AuditEvent.objects.filter(action="node.register").count() == audits
    finally:
        holder.rollback()
        holder.close()
        with connection.cursor() as cursor:
            cursor.execute("SET lock_timeout = 0")

    # Once the other transaction is done, the agent's retry goes through.
    assert client.post(REGISTER, _inventory(node), format="json").status_code == 200
    assert AuditEvent.objects.filter(action="node.register").count() == audits + 1
