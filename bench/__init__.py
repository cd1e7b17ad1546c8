"""Benchmarks: each prints a table and rewrites its own section of docs/benchmarks.md."""

from __future__ import annotations

import os
import platform
import re
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "benchmarks.md"
SHARED = Path("..") / "shared"  # relative to the repo root, where benchmarks are run from

HEADER = """# Benchmarks

Each section is written by its benchmark in `bench/` and starts with the command that
reproduces it (run from the repository root). Trace data: `../shared/traces/` (see its
PROVENANCE.md); published numbers: `../shared/anchors/`. Cite Weng et al., "Beware of
Fragmentation", USENIX ATC '23 (Alibaba traces, FGD) and Jeon et al., USENIX ATC '19 (Philly).
"""


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def speed_anchor() -> float:
    """CPU milliseconds of one fixed pure-Python loop, best of 7: how fast this machine runs
    the interpreter. Two machines' results compare once divided by their anchors (CPU time, and
    the best of several, so other work on the machine moves it less than it moves wall time)."""
    best = float("inf")
    for _ in range(7):
        started = time.process_time()
        total = 0
        for i in range(300_000):
            total += i % 7
        best = min(best, time.process_time() - started)
    return best * 1000


def machine() -> str:
    """One line naming the machine a benchmark ran on: CPU model, cores this process may use
    (of the machine's), the load average when the benchmark started (`STARTED_LOAD`) and the
    interpreter's speed there (`speed_anchor`)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    one, five, fifteen = STARTED_LOAD
    return (
        f"Machine: {_cpu_model()}, {usable} cores usable of {os.cpu_count()}, "
        f"load average at start {one:.2f} / {five:.2f} / {fifteen:.2f} (1 / 5 / 15 min), "
        f"Python {platform.python_version()}, speed anchor {speed_anchor():.1f} ms "
        "(CPU time of `bench.speed_anchor`'s fixed loop, best of 7)."
    )


def spread(values: list[float], digits: int = 1) -> str:
    """`median (min–max)` of repeated measurements, for tables."""
    if not values:
        return "–"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:,.{digits}f}"
    return f"{med:,.{digits}f} ({min(values):,.{digits}f}–{max(values):,.{digits}f})"


# When the benchmark (which imports this package first) started: other work on the machine is
# the commonest reason two runs of one benchmark disagree.
STARTED_LOAD = os.getloadavg() if hasattr(os, "getloadavg") else (float("nan"),) * 3


def command_line(module: str) -> str:
    return " ".join([".venv/bin/python", "-m", module, *map(shlex.quote, sys.argv[1:])])


def write_section(name: str, body: str) -> None:
    """Replace (or append) the section between this benchmark's markers; the body gets the
    machine line (`machine()`) unless it has one."""
    start, end = f"<!-- bench:{name}:start -->", f"<!-- bench:{name}:end -->"
    if "Machine: " not in body:  # every section says where it was measured
        body = body.rstrip() + "\n\n" + machine()
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


def wsgi_environ(
    method: str, path: str, body: bytes, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """A WSGI environ for one JSON request to the portal on 127.0.0.1 (benchmarks that call
    Django's WSGI handler in their own process, without an HTTP server); `headers` by name,
    e.g. {"Authorization": "Bearer ..."}."""
    import io

    return {
        "REQUEST_METHOD": method,
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_HOST": "127.0.0.1",
        "REMOTE_ADDR": "127.0.0.1",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "80",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": io.StringIO(),
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        **{"HTTP_" + k.upper().replace("-", "_"): v for k, v in (headers or {}).items()},
    }
