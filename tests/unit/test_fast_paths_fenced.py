"""Fast paths stay fenced: compiled reads, raw SQL and Lua only in the modules that may hold them.

docs/architecture.md ("Fast paths") lists each module and the benchmark that justifies it. A
new fast path goes into one of them, or into this list together with that section and a
docstring that cites its benchmark.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("config", "web", "portal", "scheduler", "billing", "monitoring")

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


FENCED = {
    "compiled read": {
        "portal/db.py",
        "portal/selectors.py",  # the submission's project and the member's role
        "scheduler/cycle/reads.py",
        "scheduler/selectors.py",  # the submission's GPU model
        "billing/admission.py",  # the submission's payment standing and budget; the cycle's
        "billing/selectors.py",  # the cycle's reserved plans
        "scheduler/nodes/assignments.py",  # an agent's assignments
        "scheduler/nodes/reports.py",  # the jobs and attempts a sync's reports touch
        "scheduler/nodes/tokens.py",  # the node behind an agent's token
        "scheduler/images.py",  # the curated images every heartbeat answer lists
        "scheduler/transitions.py",  # one job's state lock and its allocations' nodes
    },
    "raw SQL": {
        "portal/db.py",
        "portal/services.py",  # not yet fenced: the token lookup
        "scheduler/admission.py",  # not yet fenced: the quota's shared lock (and queue count)
        "monitoring/rollups.py",
        "monitoring/ingest.py",
        "scheduler/nodes/heartbeat.py",  # token, heartbeat and GPUs in one statement
    },
    "Lua script": {"scheduler/agent_api/gate.py", "monitoring/live.py", "portal/ratelimit.py"},
}


def _modules() -> list[tuple[str, str]]:
    out = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            if "/migrations/" not in rel and "/settings/" not in rel:
                out.append((rel, path.read_text(encoding="utf-8")))
    return out


def test_fast_paths_live_only_in_their_fenced_modules():
    modules = _modules()
    assert len(modules) > 50  # the walk found the code
    stray = [
        f"{rel}: {kind}"
        for rel, text in modules
        for kind in sorted(fast_paths_in(text))
        if rel not in FENCED[kind]
    ]
    assert stray == [], "fast path outside docs/architecture.md's 'Fast paths' modules"


def test_each_fenced_module_cites_its_benchmark():
    fenced = {
        "portal/db.py",
        "portal/cache.py",
        "portal/api/plainparse.py",
        "portal/api/serializers.py",
        "portal/ratelimit.py",
        "portal/redis_after_commit.py",
        "scheduler/cycle/reads.py",
        "scheduler/agent_api/gate.py",
        "scheduler/agent_api/fastparse.py",
        "scheduler/nodes/assignments.py",
        "scheduler/nodes/reports.py",
        "scheduler/nodes/tokens.py",
        "scheduler/nodes/heartbeat.py",
        "scheduler/images.py",
    }
    for rel in sorted(fenced):
        docstring = ast.get_docstring(ast.parse((ROOT / rel).read_text(encoding="utf-8"))) or ""
        assert "Fast path" in docstring and "bench." in docstring, rel


def test_the_fence_sees_through_aliases_other_names_and_comments():
    """The variations a text search missed: each is found, and a mention is not a use."""
    assert fast_paths_in("from portal.db import CompiledQuery as CQ\nq = CQ(None)") == {
        "compiled read"
    }
    assert fast_paths_in("from portal import db\nq = db.CompiledQuery(None)") == {"compiled read"}
    raw = "from django.db import connection\nwith connection.cursor() as cur:\n    cur.execute(sql)"
    assert fast_paths_in(raw) == {"raw SQL"}
    assert fast_paths_in("rows = Job.objects.raw(sql)") == {"raw SQL"}
    assert fast_paths_in("from django.db.models.expressions import RawSQL") == {"raw SQL"}
    assert fast_paths_in("client.eval(LUA, 1, key)") == {"Lua script"}
    assert fast_paths_in("gate = client.register_script(LUA)") == {"Lua script"}
    assert fast_paths_in("# CompiledQuery( and cursor.execute( in a comment\nx = 1") == set()
    assert fast_paths_in("pipe.execute()") == set()  # a Redis pipeline is not SQL
