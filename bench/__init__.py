"""Benchmarks: each prints a table and rewrites its own section of docs/benchmarks.md."""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "benchmarks.md"
SHARED = Path("..") / "shared"  # relative to the repo root, where benchmarks are run from

HEADER = """# Benchmarks

Each section is written by its benchmark in `bench/` and starts with the command that
reproduces it (run from the repository root). Trace data: `../shared/traces/` (see its
PROVENANCE.md); published numbers: `../shared/anchors/`. Cite Weng et al., "Beware of
Fragmentation", USENIX ATC '23 (Alibaba traces, FGD) and Jeon et al., USENIX ATC '19 (Philly).
"""


def command_line(module: str) -> str:
    return " ".join([".venv/bin/python", "-m", module, *map(shlex.quote, sys.argv[1:])])


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section between this benchmark's markers."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    text = DOCS.read_text(encoding="utf-8") if DOCS.exists() else HEADER
    block = f"{start}\n{body.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _m: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOCS.parent.mkdir(parents=True, exist_ok=True)
    DOCS.write_text(text, encoding="utf-8")


def markdown_table(columns: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)
