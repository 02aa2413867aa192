"""The parts' import rules, read from the source (ast), not from what a run happens to
import: router, local_engine and policies never import gateway; local_engine and
policies never import router. Imports inside functions, under `TYPE_CHECKING` and by
`importlib.import_module("...")` count too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Package -> the packages it must never import.
FORBIDDEN = {
    "router": ("gateway",),
    "local_engine": ("gateway", "router"),
    "policies": ("gateway", "router"),
}


def imported_modules(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in a module; relative imports stay
    inside their own package, so they are skipped."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module
        elif isinstance(node, ast.Call) and _is_import_module(node.func) and node.args:
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                yield node.lineno, first.value


def _is_import_module(func: ast.expr) -> bool:
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name in ("import_module", "__import__")


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in imported_modules(tree):
            if module.split(".")[0] in forbidden:
                found.append(f"{path.relative_to(REPO)}:{line} imports {module}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_a_part_imports_nothing_above_it(package: str) -> None:
    assert (REPO / package / "__init__.py").is_file()
    assert violations(package, FORBIDDEN[package]) == []


def test_the_check_sees_every_form_of_import() -> None:
    source = """
import gateway.http.app
from router.planner import plan_route
from . import sibling
def later():
    from gateway import cli
    importlib.import_module("router.cli")
"""
    assert [name for _, name in imported_modules(ast.parse(source))] == [
        "gateway.http.app",
        "router.planner",
        "gateway",
        "router.cli",
    ]


def test_what_serves_a_request_never_imports_training() -> None:
    """Only `router.cli` (its training commands, lazily) reaches into `router.training`:
    a gateway process never loads training or evaluation code."""
    found = []
    for path in sorted([*(REPO / "router").glob("*.py"), *(REPO / "gateway").rglob("*.py")]):
        if path == REPO / "router" / "cli.py":
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "router":
                modules = [f"router.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.ImportFrom | ast.Import):
                modules = [name for _, name in imported_modules(node)]
            else:
                continue
            found += [
                f"{path.relative_to(REPO)}:{node.lineno} imports {module}"
                for module in modules
                if module.startswith("router.training")
            ]
    assert found == []
