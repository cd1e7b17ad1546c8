"""Celery tasks keep their database connection for CONN_MAX_AGE, as requests do.

Celery's Django fixup would close it before and after every task: a new PostgreSQL backend
for every scheduling cycle. A real worker (threads) runs tasks that record their backend's pid.
"""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.db import connection, connections

from config.celery import app
from tests.polling import wait_for


@app.task(name="tests.record_backend_pid")
def record_backend_pid(key: str) -> None:
    connection.ensure_connection()
    cache.set(key, connection.connection.info.backend_pid, timeout=60)


def backend_pids(run: str, count: int) -> list[int]:
    pids = []
    for n in range(count):  # one after the other: each on whichever worker thread is free
        key = f"pid-{run}-{n}"
        record_backend_pid.delay(key)
        pids.append(wait_for(lambda key=key: cache.get(key)))
    return pids


@pytest.mark.parametrize(("max_age", "most_backends"), [(60, 2), (0, 6)])
def test_tasks_reuse_a_connection_younger_than_conn_max_age(
    celery_live_worker, monkeypatch, max_age, most_backends
):
    monkeypatch.setitem(connections.settings["default"], "CONN_MAX_AGE", max_age)
    pids = backend_pids(f"age{max_age}", 6)
    assert len(set(pids)) <= most_backends  # two worker threads: at most two with reuse
    if max_age == 0:
        assert len(set(pids)) == 6  # closed after every task, as before
