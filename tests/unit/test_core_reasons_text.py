"""Spans and instants in the words the job page uses."""

from __future__ import annotations

import pytest

from scheduler.core.reasons import format_duration, format_when


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0 s"),
        (45, "45 s"),
        (89, "1 min"),
        (1200, "20 min"),
        (3599, "1 h"),  # rounded to the minute, then carried
        (3600, "1 h"),
        (9000, "2 h 30 min"),
        (47 * 3600 + 60, "47 h 1 min"),
        (48 * 3600, "2 days"),
        (76 * 3600, "3 days 4 h"),
        (-5, "0 s"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_format_when_says_now_or_how_long_until():
    now = 1_700_000_000.0
    assert format_when(now + 30, now) == "now"
    assert format_when(now + 25 * 60, now).endswith("(in 25 min)")
    assert format_when(now + 3 * 86400, now).endswith("(in 3.0 days)")
