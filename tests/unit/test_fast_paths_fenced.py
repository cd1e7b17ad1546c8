"""Fast paths stay fenced: compiled reads, raw SQL and Lua only in `foundation/` or in a module
listed in `FENCED`, which cites its benchmark.

One rule, one list. `foundation/` (the plumbing at the bottom of the layering) holds the fast
paths every app builds on; outside it, a fast path lives only in a module listed here with the
benchmark that justifies it (named in the module: its docstring, or a comment at the fast
path), and docs/architecture.md ("Fast paths") names exactly these modules. A new fast path
goes into `foundation/`, or into this list, that section and its module's text together, with
a side-by-side figure in docs/benchmarks.md (issue 26: kept only at 1.5x or more).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("config", "web", "foundation", "portal", "scheduler", "billing", "monitoring")
FOUNDATION = "foundation/"

# What each kind of fast path looks like in the syntax tree, not in the text: an alias
# (`CompiledQuery as CQ`), a cursor under another name (`cur.execute`), a Lua `eval` or a
# mention in a comment cannot slip past or trip it.
COMPILED_READ_NAMES = frozenset({"CompiledQuery"})
RAW_SQL_CALLS = frozenset({"cursor", "raw", "executemany"})  # every cursor starts at .cursor()
RAW_SQL_NAMES = frozenset({"RawSQL"})
LUA_CALLS = frozenset({"Script", "register_script", "eval", "evalsha", "script_load"})


def _called(node: ast.Call) -> str | None:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def _named(node: ast.AST) -> str | None:
    """The name a node mentions: an imported name (before any `as`), a name or an attribute."""
    if isinstance(node, ast.alias):
        return node.name.rsplit(".", 1)[-1]
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def fast_paths_in(source: str) -> set[str]:
    """The kinds of fast path a module's code uses."""
    kinds = set()
    for node in ast.walk(ast.parse(source)):
        name = _named(node)
        called = _called(node) if isinstance(node, ast.Call) else None
        if name in COMPILED_READ_NAMES:
            kinds.add("compiled read")
        if called in RAW_SQL_CALLS or name in RAW_SQL_NAMES:
            kinds.add("raw SQL")
        if called in LUA_CALLS:
            kinds.add("Lua script")
    return kinds


# Every fast-path module outside foundation/, and the benchmark its text cites.
FENCED: dict[str, str] = {
    # compiled reads beside their callers
    "portal/selectors.py": "bench.submit_throughput",
    "scheduler/cycle/reads.py": "bench.fast_paths",
    "scheduler/selectors.py": "bench.submit_throughput",
    "scheduler/transitions.py": "bench.endpoint_cost",
    "scheduler/images.py": "bench.agent_cost",
    "scheduler/nodes/assignments.py": "bench.agent_requests",
    "scheduler/nodes/reports.py": "bench.submit_throughput",
    "scheduler/nodes/tokens.py": "bench.agent_requests",
    "billing/admission.py": "bench.cycle_cost",
    "billing/selectors.py": "bench.cycle_cost",
    # raw SQL
    "portal/services.py": "bench.submit_cost",
    "scheduler/admission.py": "bench.submit_cost",
    "scheduler/nodes/heartbeat.py": "bench.agent_cost",
    "monitoring/rollups.py": "bench.telemetry_ingest",
    "monitoring/ingest.py": "bench.telemetry_ingest",
    # Lua
    "scheduler/agent_api/gate.py": "bench.agent_requests",
    "monitoring/live.py": "bench.telemetry_ingest",
    # plain parsers and serializer plans
    "scheduler/agent_api/fastparse.py": "bench.agent_requests",
    "portal/api/serializers.py": "bench.submit_cost",
}


def _modules() -> list[tuple[str, str]]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" not in rel and "/settings/" not in rel:
                out.append((rel, path.read_text(encoding="utf-8")))
    return out


def test_fast_paths_live_only_in_foundation_or_a_fenced_module():
    modules = _modules()
    assert len(modules) > 50  # the walk found the code
    stray = [
        f"{rel}: {kind}"
        for rel, text in modules
        for kind in sorted(fast_paths_in(text))
        if not rel.startswith(FOUNDATION) and rel not in FENCED
    ]
    assert stray == [], "fast path outside foundation/ and the fenced modules"


def test_each_fenced_module_cites_its_benchmark():
    missing = []
    for rel, benchmark in sorted(FENCED.items()):
        text = (ROOT / rel).read_text(encoding="utf-8")
        if "Fast path" not in text or benchmark not in text:
            missing.append(f"{rel}: {benchmark}")
    assert missing == []


def test_architecture_names_exactly_the_fenced_modules():
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## Fast paths", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\| `([a-z_/]+\.py)` \|", section, re.M))  # the tables' rows
    outside = {rel for rel in named if not rel.startswith(FOUNDATION)}
    assert outside == {rel for rel in FENCED if not rel.startswith(FOUNDATION)}


def test_the_fence_sees_through_aliases_other_names_and_comments():
    """The variations a text search missed: each is found, and a mention is not a use."""
    assert fast_paths_in("from foundation.db import CompiledQuery as CQ\nq = CQ(None)") == {
        "compiled read"
    }
    assert fast_paths_in("from foundation import db\nq = db.CompiledQuery(None)") == {
        "compiled read"
    }
    raw = "from django.db import connection\nwith connection.cursor() as cur:\n    cur.execute(sql)"
    assert fast_paths_in(raw) == {"raw SQL"}
    assert fast_paths_in("rows = Job.objects.raw(sql)") == {"raw SQL"}
    assert fast_paths_in("from django.db.models.expressions import RawSQL") == {"raw SQL"}
    assert fast_paths_in("client.eval(LUA, 1, key)") == {"Lua script"}
    assert fast_paths_in("gate = client.register_script(LUA)") == {"Lua script"}
    assert fast_paths_in("# CompiledQuery( and cursor.execute( in a comment\nx = 1") == set()
    assert fast_paths_in("pipe.execute()") == set()  # a Redis pipeline is not SQL
