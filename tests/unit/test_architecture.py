"""Layering rules from docs/architecture.md, checked on the source: they cannot silently rot."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUR_PACKAGES = {"portal", "scheduler", "billing", "monitoring", "agent"}


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def python_files(*folders: str) -> list[Path]:
    return [
        p
        for folder in folders
        for p in (ROOT / folder).rglob("*.py")
        if ".venv" not in p.parts and "migrations" not in p.parts
    ]


def test_scheduler_core_is_pure():
    files = python_files("scheduler/core")
    assert files, "scheduler/core has no modules"
    for path in files:
        for name in imported_modules(path):
            top = name.split(".")[0]
            assert top not in {"django", "rest_framework", "pynvml", "celery"}, (path, name)
            if top in OUR_PACKAGES:
                assert name.startswith("scheduler.core"), f"{path} imports {name}"


def test_only_the_agent_imports_pynvml():
    for path in python_files("portal", "scheduler", "billing", "monitoring", "bench"):
        assert not any(n.split(".")[0] == "pynvml" for n in imported_modules(path)), path


def test_stripe_only_in_the_billing_gateway():
    for path in python_files("portal", "scheduler", "billing", "monitoring", "agent"):
        if path.name == "gateway.py" and path.parent.name == "billing":
            continue
        assert not any(n.split(".")[0] == "stripe" for n in imported_modules(path)), path
