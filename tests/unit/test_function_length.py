"""No function in the product packages is longer than MAX_LINES unless it says why.

A long process reads as named steps (`billing/services/invoices.py`'s `invoice_close`, the
cycle's `scheduler/cycle/`). A function that truly cannot be cut says so in its docstring, after
CANNOT_CUT, with the reason. Checked on the source with `ast`; no database, no imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.unit.test_architecture import OUR_PACKAGES, ROOT, python_files

MAX_LINES = 80
# The docstring marker of a function that cannot be cut, followed by why.
CANNOT_CUT = "Not cut into steps:"
PRODUCT_FOLDERS = sorted(OUR_PACKAGES | {"cli"})
NOT_PRODUCT = {"tests", "bench", "migrations"}


def is_argparse_builder(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """An argparse builder, which may be long (one `add_argument` per option): a function whose
    return annotation is `ArgumentParser` (`argparse.ArgumentParser`)."""
    returns = fn.returns
    if isinstance(returns, ast.Constant) and isinstance(returns.value, str):
        return returns.value.rpartition(".")[2] == "ArgumentParser"
    if isinstance(returns, ast.Attribute):
        return returns.attr == "ArgumentParser"
    return isinstance(returns, ast.Name) and returns.id == "ArgumentParser"


def says_why_not_cut(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the docstring names, after CANNOT_CUT, a reason (a few words at least)."""
    doc = ast.get_docstring(fn) or ""
    _, marker, why = doc.partition(CANNOT_CUT)
    return bool(marker) and len(why.split()) >= 4


def long_functions(source: str, *, max_lines: int = MAX_LINES) -> list[tuple[str, int]]:
    """(name, lines) of each function in `source` over `max_lines` lines (its `def` line to its
    last line, decorators left out) that is no argparse builder and does not say why."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        lines = (node.end_lineno or node.lineno) - node.lineno + 1
        if lines > max_lines and not is_argparse_builder(node) and not says_why_not_cut(node):
            found.append((node.name, lines))
    return found


def product_files() -> list[Path]:
    return [
        p
        for p in python_files(*PRODUCT_FOLDERS)
        if not NOT_PRODUCT & set(p.relative_to(ROOT).parts)
    ]


def test_no_function_in_the_product_packages_is_over_the_limit_without_saying_why():
    files = product_files()
    assert any(p.relative_to(ROOT).parts[0] == "cli" for p in files), "cli not scanned"
    too_long = [
        f"{rel}::{name} is {lines} lines"
        for path in files
        for rel in [path.relative_to(ROOT).as_posix()]
        for name, lines in long_functions(path.read_text())
    ]
    assert too_long == [], (
        f"cut these into named steps (at most {MAX_LINES} lines each), or say in the "
        f"docstring, after {CANNOT_CUT!r}, why they cannot be cut"
    )


def _body(lines: int) -> str:
    return "".join("    x = 1\n" for _ in range(lines))


def test_the_length_rule_counts_what_it_says():
    assert long_functions("def short():\n" + _body(79)) == []  # 80 lines: at the limit
    assert long_functions("def long():\n" + _body(80)) == [("long", 81)]
    nested = "def outer():\n    def inner():\n" + "    " + _body(80).replace("\n", "\n    ")
    assert {name for name, _ in long_functions(nested)} == {"outer", "inner"}


def test_a_docstring_that_says_why_exempts_and_a_bare_marker_does_not():
    why = f'def kept():\n    """{CANNOT_CUT} one ordered table the reader scans as one."""\n'
    bare = f'def bare():\n    """{CANNOT_CUT}"""\n'
    assert long_functions(why + _body(80)) == []
    assert long_functions(bare + _body(80)) == [("bare", 82)]


def test_argparse_builders_are_exempt_by_their_return_annotation():
    for returns in ("argparse.ArgumentParser", "ArgumentParser", "'argparse.ArgumentParser'"):
        assert long_functions(f"def build_parser() -> {returns}:\n" + _body(100)) == []
    assert long_functions("def main(argv) -> int:\n" + _body(100)) == [("main", 101)]
