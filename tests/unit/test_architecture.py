"""Layering rules from docs/architecture.md, checked on the source: they cannot silently rot."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# The one place the direction between our packages is written down: each may import only those
# it names (and itself). The top layer (`config`, `web`) composes the apps; billing and monitoring
# build on the scheduler; the scheduler on storage, storage on tenancy (`portal`); every app on
# the plumbing (`foundation`), which imports none of ours.
MAY_IMPORT: dict[str, set[str]] = {
    "config": {"web", "billing", "monitoring", "scheduler", "storage", "portal", "foundation"},
    "web": {"billing", "monitoring", "scheduler", "storage", "portal", "foundation"},
    "billing": {"scheduler", "storage", "portal", "foundation"},
    "monitoring": {"scheduler", "storage", "portal", "foundation"},
    # of the agent, only its wire contract (see WIRE_CONTRACT)
    "scheduler": {"storage", "portal", "foundation", "agent"},
    "storage": {"portal", "foundation"},  # volumes and datasets; the scheduler answers a port
    "portal": {"foundation"},
    "foundation": set(),
    "agent": set(),  # the node agent ships alone: stdlib and pynvml
}
# The one module of the agent others may import: the agent↔portal messages, defined once.
WIRE_CONTRACT = "agent.protocol"
# Inner packages held to a stricter rule than their app: they import nothing of ours outside.
SELF_CONTAINED = {"scheduler.core"}
OUR_PACKAGES = set(MAY_IMPORT)
TOP_LAYER = {"config", "web"}
# Template folders and the app whose templates they are; files at the root are shared layout.
TEMPLATE_OWNER = {
    "web": "web",
    "portal": "portal",
    "registration": "portal",
    "scheduler": "scheduler",
    "ops": "scheduler",
    "billing": "billing",
    "monitoring": "monitoring",
    "storage": "storage",
}


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
    for path in python_files(*sorted(OUR_PACKAGES - {"agent"}), "bench"):
        assert not any(n.split(".")[0] == "pynvml" for n in imported_modules(path)), path


def test_stripe_only_in_the_billing_gateway():
    for path in python_files(*sorted(OUR_PACKAGES)):
        if path.name == "gateway.py" and path.parent.name == "billing":
            continue
        assert not any(n.split(".")[0] == "stripe" for n in imported_modules(path)), path


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in python_files(*sorted(OUR_PACKAGES))}


def imports_of(name: str, path: Path) -> set[str]:
    """Every module of ours that `name` imports, at the top or inside a function (a lazy import
    is a dependency all the same). `from pkg import mod` counts as importing `pkg.mod`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")
    return {n for n in found if n.split(".")[0] in OUR_PACKAGES}


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def import_graph() -> dict[str, set[str]]:
    modules = all_modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {resolve(n, modules) for n in imports_of(name, path)}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_imports_inside_functions_and_relative_ones_count(tmp_path):
    module = tmp_path / "probe.py"
    module.write_text(
        "from scheduler.models import Job\n"
        "def later():\n"
        "    from .selectors import job_placement\n"
        "    import billing.pricing\n"
        "    from portal import audit\n"
    )
    assert imports_of("scheduler.probe", module) == {
        "scheduler.models",
        "scheduler.models.Job",
        "scheduler.selectors",
        "scheduler.selectors.job_placement",
        "billing.pricing",
        "portal",
        "portal.audit",
    }
    graph = import_graph()
    assert "scheduler.nodes" in graph["scheduler.tasks"]  # a lazy import in a task, seen


def test_no_import_cycle_between_our_packages():
    graph = import_graph()
    packages: dict[str, set[str]] = {p: set() for p in OUR_PACKAGES}
    for source, targets in graph.items():
        for target in targets:
            if target.split(".")[0] != source.split(".")[0]:
                packages[source.split(".")[0]].add(target.split(".")[0])
    assert cycles(packages) == []


@pytest.mark.parametrize("package", sorted(OUR_PACKAGES))
def test_no_import_cycle_between_the_modules_of_a_package(package):
    graph = import_graph()
    inside = {
        m: {t for t in targets if t.split(".")[0] == package}
        for m, targets in graph.items()
        if m.split(".")[0] == package
    }
    assert inside, f"no modules found in {package}"
    assert cycles(inside) == []


def test_apps_import_only_in_the_allowed_direction():
    wrong = []
    for source, targets in sorted(import_graph().items()):
        here = source.split(".")[0]
        for target in sorted(targets):
            there = target.split(".")[0]
            if there != here and there not in MAY_IMPORT[here]:
                wrong.append(f"{source} imports {target}")
            if there == "agent" != here and target != WIRE_CONTRACT:
                wrong.append(f"{source} imports {target}: only {WIRE_CONTRACT} is shared")
            for inner in SELF_CONTAINED:
                inside = source == inner or source.startswith(inner + ".")
                if inside and not (target == inner or target.startswith(inner + ".")):
                    wrong.append(f"{source} imports {target}, outside {inner}")
    assert wrong == []


def test_the_allowed_direction_has_no_cycle_and_keeps_the_plumbing_at_the_bottom():
    assert cycles({p: set(d) for p, d in MAY_IMPORT.items()}) == []
    assert MAY_IMPORT["foundation"] == set() and MAY_IMPORT["agent"] == set()
    assert MAY_IMPORT["portal"] == {"foundation"}  # tenancy: only the plumbing below it
    assert not any(TOP_LAYER & deps for p, deps in MAY_IMPORT.items() if p not in TOP_LAYER)


def test_services_never_import_tasks():
    """Tasks import services; services queue tasks by name (foundation/enqueue.py)."""
    wrong = [
        f"{source} imports {target}"
        for source, targets in sorted(import_graph().items())
        for target in targets
        if target.rpartition(".")[2] == "tasks" and source.rpartition(".")[2] != "tasks"
    ]
    assert wrong == []


TEMPLATE_REF = re.compile(r"""{%\s*(?:include|extends)\s+["']([^"']+)["']""")


def template_owner(name: str) -> str | None:
    """The app a template belongs to; None for shared layout at the root (base.html)."""
    folder, _, rest = name.partition("/")
    if not rest:
        return None
    assert folder in TEMPLATE_OWNER, f"template folder {folder}/ has no owner in TEMPLATE_OWNER"
    return TEMPLATE_OWNER[folder]


def test_no_domain_template_includes_another_apps_templates():
    root = ROOT / "templates"
    wrong = []
    templates = sorted(root.rglob("*.html")) + sorted(root.rglob("*.txt"))
    assert templates
    for path in templates:
        name = path.relative_to(root).as_posix()
        owner = template_owner(name)
        for ref in TEMPLATE_REF.findall(path.read_text()):
            assert (root / ref).exists(), f"{name} includes {ref}, which does not exist"
            other = template_owner(ref)
            if other is None or other == owner:
                continue
            if owner is None or owner not in TOP_LAYER or other not in MAY_IMPORT[owner]:
                wrong.append(f"{name} includes {ref}")
    assert wrong == []


def test_views_render_only_their_own_or_lower_apps_templates():
    wrong = []
    literal = re.compile(r"""["']([a-z_]+/[\w/]+\.(?:html|txt))["']""")
    for name, path in sorted(all_modules().items()):
        here = name.split(".")[0]
        for ref in literal.findall(path.read_text()):
            other = template_owner(ref)
            if other is not None and other != here and other not in MAY_IMPORT[here]:
                wrong.append(f"{name} uses {ref}")
    assert wrong == []
