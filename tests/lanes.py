"""The suite's lanes, as scripts/test.sh runs them (`-p tests.lanes`): the unit lane (tests/unit,
no database) first, then every other directory in its usual order; at the end a table of the time
each top-level directory took (setup, call and teardown of its tests, so a session fixture's
start-up counts where it was first needed). The closing `N passed` line stays pytest's own."""

from __future__ import annotations

from collections import defaultdict
from pathlib import PurePath

import pytest

FIRST = "unit"  # the fast lane: a failure there shows in the first minute, not the last

_seconds: dict[str, float] = defaultdict(float)
_tests: dict[str, int] = defaultdict(int)


def lane_of(nodeid: str) -> str:
    """The top-level directory under tests/ a test lives in ("unit", "stack", ...)."""
    parts = PurePath(nodeid.split("::", 1)[0]).parts
    if len(parts) >= 3 and parts[0] == "tests":
        return parts[1]
    return parts[0] if parts else "?"


@pytest.hookimpl(trylast=True)  # after pytest-django's own ordering, which it keeps
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # sort() is stable: within each lane the order so far is kept.
    items.sort(key=lambda item: lane_of(item.nodeid) != FIRST)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    lane = lane_of(report.nodeid)
    _seconds[lane] += report.duration
    if report.when == "call" or (report.when == "setup" and not report.passed):
        _tests[lane] += 1


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    if not _seconds:
        return
    tr = terminalreporter
    tr.write_sep("=", "time per directory")
    width = max(len(lane) for lane in _seconds)
    for lane in sorted(_seconds, key=lambda lane: (lane != FIRST, lane)):
        minutes, seconds = divmod(_seconds[lane], 60)
        tr.write_line(
            f"tests/{lane:<{width}}  {_tests[lane]:>5} tests  {int(minutes):>3}m {seconds:04.1f}s"
        )
    total = sum(_seconds.values())
    tr.write_line(
        f"{'total (tests only)':<{width + 6}}  {sum(_tests.values()):>5} tests  "
        f"{int(total // 60):>3}m {total % 60:04.1f}s"
    )
