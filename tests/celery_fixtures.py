"""A real Celery worker (in a thread of the test process) on the real Redis broker."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery.contrib.testing.worker import start_worker

from config.celery import app


@pytest.fixture
def celery_live_worker(transactional_db) -> Iterator[object]:
    from foundation.locks import lock_clear

    app.conf.task_always_eager = False
    for name in ("scheduler-cycle", "autoscaler"):
        lock_clear(name)  # a worker killed by an earlier test may have left one behind
    with start_worker(
        app,
        pool="threads",
        concurrency=2,
        queues=["scheduler", "default", "provisioning", "telemetry", "billing"],
        perform_ping_check=False,
        shutdown_timeout=30,
    ) as worker:
        yield worker
