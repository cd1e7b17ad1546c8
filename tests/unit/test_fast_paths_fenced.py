"""Fast paths stay fenced: compiled reads, raw SQL and Lua only in the modules that may hold them.

docs/architecture.md ("Fast paths") lists each module and the benchmark that justifies it. A
new fast path goes into one of them, or into this list together with that section and a
docstring that cites its benchmark.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("config", "web", "portal", "scheduler", "billing", "monitoring")

FENCED = {
    "compiled read": (
        re.compile(r"\bCompiledQuery\("),
        {
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
    ),
    "raw SQL": (
        re.compile(r"\.raw\(|cursor\.execute|\.executemany\("),
        {
            "portal/db.py",
            "portal/services.py",  # not yet fenced: the token lookup
            "scheduler/admission.py",  # not yet fenced: the quota's shared lock (and queue count)
            "monitoring/rollups.py",
            "monitoring/ingest.py",
            "scheduler/nodes/heartbeat.py",  # token, heartbeat and GPUs in one statement
        },
    ),
    "Lua script": (
        re.compile(r"\bScript\(|register_script\("),
        {"scheduler/agent_api/gate.py", "monitoring/live.py", "portal/ratelimit.py"},
    ),
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
        for kind, (pattern, allowed) in FENCED.items()
        for rel, text in modules
        if pattern.search(text) and rel not in allowed
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
        text = (ROOT / rel).read_text(encoding="utf-8")
        docstring = text.split('"""')[1]
        assert "Fast path" in docstring and "bench." in docstring, rel
