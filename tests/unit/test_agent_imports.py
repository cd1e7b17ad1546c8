"""The agent stays a small, separate program: standard library, requests and pynvml only."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

AGENT = Path(__file__).resolve().parents[2] / "agent"
ALLOWED = set(sys.stdlib_module_names) | {"requests", "pynvml", "agent", "__future__"}


def test_the_agent_imports_only_stdlib_requests_and_pynvml() -> None:
    files = sorted(AGENT.rglob("*.py"))
    assert len(files) >= 8
    seen: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                seen.add(top)
                assert top in ALLOWED, f"{path.name} imports {name}"
    assert {"requests", "pynvml"} <= seen  # and it does use them


def test_pynvml_comes_from_nvidia_ml_py() -> None:
    from importlib.metadata import PackageNotFoundError, distribution

    import pynvml

    assert distribution("nvidia-ml-py").version
    try:
        distribution("pynvml")
    except PackageNotFoundError:
        pass
    else:
        raise AssertionError("the deprecated 'pynvml' package is installed next to nvidia-ml-py")
    assert hasattr(pynvml, "nvmlDeviceGetCurrentClocksEventReasons")
