"""The parts' import rules, read from the source (ast), not from what a run happens to
import: router, local_engine and policies never import gateway; local_engine and
policies never import router. Imports inside functions, under `TYPE_CHECKING` and by
`importlib.import_module("...")` count too.

Under tests/, no module imports a `test_*` module: what tests share lives in support
modules (tests/gateway/cascade_scenario.py, tests/local_engine/tiny_models.py, ...), so
that editing one test module never changes another, nor does pytest collect a test twice.
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


def imported_test_modules(tree: ast.AST, package: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    """(line, module) of each `test_*` module imported by a module of `package` (such as
    ("tests", "gateway")): by its name, from its package (`from tests.gateway import
    test_cli`) or relatively (`from .test_cli import EXE`)."""
    yield from ((line, name) for line, name in imported_modules(tree) if _is_test_module(name))
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        base = _absolute(node, package)
        if _is_test_module(base):
            if node.level:  # absolute ones came from `imported_modules`
                yield node.lineno, base
            continue
        for alias in node.names:
            name = f"{base}.{alias.name}"
            if _is_test_module(name) and _is_module(name):
                yield node.lineno, name


def _absolute(node: ast.ImportFrom, package: tuple[str, ...]) -> str:
    """The module an ImportFrom takes its names from, relative imports resolved."""
    parts = package[: len(package) - node.level + 1] if node.level else ()
    return ".".join([*parts, *([node.module] if node.module else [])])


def _is_test_module(name: str) -> bool:
    return any(part.startswith("test_") for part in name.split("."))


def _is_module(name: str) -> bool:
    """Whether a dotted name is a module or package of this repository (not a function
    or class that happens to be called `test_...`)."""
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


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


def test_no_test_module_is_imported_by_another_module() -> None:
    found = []
    for path in sorted((REPO / "tests").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        package = path.relative_to(REPO).parent.parts
        found += [
            f"{path.relative_to(REPO)}:{line} imports {module}"
            for line, module in imported_test_modules(tree, package)
        ]
    assert not found, (
        "test modules are imported; move what they share into a support module "
        "(a name not starting with `test_`, or conftest.py for fixtures):\n" + "\n".join(found)
    )


def test_the_test_module_check_sees_every_form_of_import() -> None:
    source = """
import tests.gateway.test_hedging
from tests.gateway.test_selector import runtime
from tests.gateway import conftest, test_cli
from tests.support import eventually
from .test_select_e2e import PICK
from . import scripted, test_sla
from ..local_engine import test_cpu_engine
from .cascade_scenario import GOOD
def later():
    importlib.import_module("tests.fakes.test_fakes")
"""
    found = imported_test_modules(ast.parse(source), ("tests", "gateway"))
    assert sorted(name for _, name in found) == [
        "tests.fakes.test_fakes",
        "tests.gateway.test_cli",
        "tests.gateway.test_hedging",
        "tests.gateway.test_select_e2e",
        "tests.gateway.test_selector",
        "tests.gateway.test_sla",
        "tests.local_engine.test_cpu_engine",
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
