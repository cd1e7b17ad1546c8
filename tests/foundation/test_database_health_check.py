"""The PostgreSQL health check (foundation/db_backends/postgresql): no round trip for a live
connection, and a connection the server ended is noticed and replaced before a request uses it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.core.signals import request_started
from django.db import DatabaseError, connection, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.db.backends.postgresql.base import DatabaseWrapper as DjangoDatabaseWrapper

from foundation.db_backends.postgresql.base import DatabaseWrapper as PortalDatabaseWrapper
from portal.models import Project
from tests.polling import wait_for


@pytest.fixture
def other() -> Iterator[BaseDatabaseWrapper]:
    """A second connection to the same database, to watch and to end the first one from."""
    wrapper = connections.create_connection("default")
    try:
        yield wrapper
    finally:
        wrapper.close()


def backend_pid(wrapper: BaseDatabaseWrapper) -> int:
    wrapper.ensure_connection()
    return int(wrapper.connection.info.backend_pid)


def last_statement(other: BaseDatabaseWrapper, pid: int) -> str:
    with other.cursor() as cursor:
        cursor.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid])
        return str(cursor.fetchone()[0])


def next_request() -> None:
    """What Django's handler does as a request begins: `close_old_connections`, which keeps a
    persistent connection and arms its health check for the request's first query."""
    request_started.send(sender=next_request)


def test_the_settings_select_the_portal_backend_and_it_is_still_postgresql():
    assert isinstance(connections["default"], PortalDatabaseWrapper)
    assert connection.settings_dict["ENGINE"].endswith("postgresql")  # prepared_statements()
    assert connection.vendor == "postgresql"


@pytest.mark.django_db
def test_a_live_connection_is_usable_and_checking_it_sends_nothing_to_the_server(other):
    pid = backend_pid(connection)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'the last statement before the checks'")
    assert last_statement(other, pid) == "SELECT 'the last statement before the checks'"

    assert all(connection.is_usable() for _ in range(1000))
    assert last_statement(other, pid) == "SELECT 'the last statement before the checks'"
    assert backend_pid(connection) == pid

    # The watch would have seen a round trip: Django's own check is one.
    assert DjangoDatabaseWrapper.is_usable(connection)
    assert last_statement(other, pid) == "SELECT 1"


@pytest.mark.django_db(transaction=True)
def test_a_backend_the_server_ended_is_unusable_and_the_next_request_reconnects(other, client):
    settings_dict = connection.settings_dict
    max_age = settings_dict["CONN_MAX_AGE"]
    settings_dict["CONN_MAX_AGE"] = 60  # persistent, as in production
    connection.close()
    try:
        Project.objects.count()
        pid = backend_pid(connection)
        next_request()
        assert Project.objects.count() == 0
        assert backend_pid(connection) == pid  # kept across requests

        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pid])
            assert cursor.fetchone() == (True,)
        # The server sends its FATAL and closes; once that arrives the socket is readable.
        wait_for(lambda: not connection.is_usable(), timeout=5, interval=0.01)

        next_request()
        assert Project.objects.count() == 0  # no error: a fresh connection answered
        fresh = backend_pid(connection)
        assert fresh != pid
        assert connection.is_usable()

        # The same through a whole request: /readyz runs its own SELECT 1 on a fresh connection.
        with other.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [fresh])
        wait_for(lambda: not connection.is_usable(), timeout=5, interval=0.01)
        next_request()
        resp = client.get("/readyz")
        assert resp.status_code == 200, resp.content
        assert resp.json()["checks"]["database"]["ok"] is True
        assert backend_pid(connection) not in (pid, fresh)
    finally:
        settings_dict["CONN_MAX_AGE"] = max_age
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_an_aborted_transaction_or_a_closed_connection_is_unusable(other):
    other.set_autocommit(False)
    with pytest.raises(DatabaseError), other.cursor() as cursor:
        cursor.execute("SELECT 1 / 0")
    assert not other.is_usable()  # in a failed transaction, as SELECT 1 would find
    other.rollback()
    assert other.is_usable()
    other.set_autocommit(True)

    other.connection.close()  # closed under Django
    assert not other.is_usable()


@pytest.mark.django_db(transaction=True)
def test_readyz_reports_a_database_that_does_not_answer(client):
    settings_dict = connection.settings_dict
    host, port = settings_dict["HOST"], settings_dict["PORT"]
    settings_dict["HOST"], settings_dict["PORT"] = "127.0.0.1", "1"  # nothing listens there
    connection.close()
    try:
        resp = client.get("/readyz")
        assert resp.status_code == 503
        database = resp.json()["checks"]["database"]
        assert database["ok"] is False and "OperationalError" in database["error"]
    finally:
        settings_dict["HOST"], settings_dict["PORT"] = host, port
        connection.close()
