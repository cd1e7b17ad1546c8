"""`wait_for`: the one poll-until-true helper of the test suite (no Django, no Celery)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def wait_for(
    predicate: Callable[[], Any],
    timeout: float = 20.0,
    interval: float = 0.1,
    *,
    between: Callable[[], object] | None = None,
) -> Any:
    """Poll until `predicate()` is truthy and return its value; fail clearly on timeout.

    `between` runs before each try (e.g. a runner's `poll()` that makes progress happen).
    """
    deadline = time.monotonic() + timeout
    while True:
        if between is not None:
            between()
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(interval)
