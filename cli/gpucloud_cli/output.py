"""Output for people (aligned tables, `key: value` lines) and for programs (`--json`)."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, TextIO


def emit_json(data: Any, out: TextIO = sys.stdout) -> None:
    json.dump(data, out, indent=2, sort_keys=False)
    out.write("\n")


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], out: TextIO = sys.stdout) -> None:
    """Columns as wide as their widest cell; numbers right-aligned; '-' for nothing."""
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    numeric = [True] * len(headers)
    for row in cells:
        for i, text in enumerate(row):
            widths[i] = max(widths[i], len(text))
            if text != "-" and not _is_number(text):
                numeric[i] = False

    def line(values: Sequence[str]) -> str:
        parts = [
            v.rjust(widths[i]) if numeric[i] else v.ljust(widths[i]) for i, v in enumerate(values)
        ]
        return "  ".join(parts).rstrip()

    out.write(line(list(headers)) + "\n")
    for row in cells:
        out.write(line(row) + "\n")


def pairs(items: Iterable[tuple[str, Any]], out: TextIO = sys.stdout) -> None:
    shown = [(k, _cell(v)) for k, v in items]
    width = max((len(k) for k, _ in shown), default=0)
    for key, value in shown:
        out.write(f"{(key + ':').ljust(width + 1)}  {value}\n")


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


def when(stamp: str | None) -> str:
    """An API timestamp, shortened for a table: '2026-12-01 14:20' (UTC as the API gives it)."""
    if not stamp:
        return "-"
    return stamp.replace("T", " ")[:16]
