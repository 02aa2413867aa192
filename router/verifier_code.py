"""Gates on code answers from what the prompt states: the function it names and the
tests it gives (``assert f(2) == 4`` lines, as MBPP-style prompts carry them).

Rules, not weights: the shipped MBPP prompts state neither (the data's prompts are one
line of text), so nothing there could teach a weight. An answer that defines none of
the names the prompt asks for cannot pass its tests; one whose run fails a stated test
is wrong by the prompt's own account; one that passes every stated test has met the
specification the user gave. (Code that does not parse is no such sign: 40% of the
shipped MBPP answers whose code does not parse are right, 51% of the rest.)

    tests = stated_tests(question)        # (("f(2)", "4"),): run with the answer's code
    score = gated(score, question, answer, run)
"""

from __future__ import annotations

import ast
import builtins
import re

from router.answers import code_text
from router.code_examples import ExampleRun

MAX_TESTS = 10
MAX_TEST_CHARS = 500
# Caps and a floor (the score is at most / at least this when the rule applies).
NAME_MISSING_CAP = 0.2  # the function the prompt's tests call is not defined
TESTS_FAILED_CAP = 0.2  # a test the prompt states failed when the answer ran
TESTS_HELD_FLOOR = 0.8  # every test the prompt states held
# Possessive and ending on a non-blank: a lazy group before `[ \t]*$` rescanned a run
# of spaces once per character (0.75 s for a 16k prompt).
_ASSERT = re.compile(r"^[ \t>]*+assert[ \t]++(.*[^ \t\n])[ \t]*+$", re.MULTILINE)
_CALLED = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
# "a function `is_prime`", "named is_prime", "called is_prime()", "def is_prime(".
# A name counts when it reads as code: in backticks, with an underscore or a "(".
_NAMED = re.compile(
    r"(?:\bfunction|\bnamed|\bcalled|\bdef)\s+(?:named\s+|called\s+)?(`)?([A-Za-z_]\w*)`?(\s*\()?",
    re.IGNORECASE,
)
_BUILTINS = frozenset(dir(builtins))


def stated_tests(question: str) -> tuple[tuple[str, str], ...]:
    """The prompt's ``assert`` lines as (source, expected) examples: ``assert X == Y``
    checks X against the literal Y; any other assertion checks ``bool(...)`` is True."""
    tests = []
    for line in _ASSERT.findall(question)[:MAX_TESTS]:
        test = _as_example(line.rstrip(";"))
        if test is not None and max(map(len, test)) <= MAX_TEST_CHARS:
            tests.append(test)
    return tuple(dict.fromkeys(tests))


def _as_example(line: str) -> tuple[str, str] | None:
    try:
        node = ast.parse(line, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    if isinstance(node, ast.Tuple):  # `assert x, "message"` parsed as a tuple
        node = node.elts[0] if node.elts else node
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.Eq):
        right = ast.unparse(node.comparators[0])
        if _literal(right):
            return ast.unparse(node.left), right
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return f"bool({ast.unparse(node.operand)})", "False"
    return f"bool({ast.unparse(node)})", "True"


def _literal(text: str) -> bool:
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
        return False
    return True


def asked_names(question: str) -> frozenset[str]:
    """The functions the prompt asks for: those its tests call (not builtins), else
    those it names ("a function `f`", "named f", "def f(")."""
    called = {
        name
        for line in _ASSERT.findall(question)
        for name in _CALLED.findall(line)
        if name not in _BUILTINS and name not in {"assert", "set", "sorted"}
    }
    if called:
        return frozenset(called)
    return frozenset(
        m.group(2)
        for m in _NAMED.finditer(question)
        if m.group(1) or m.group(3) or "_" in m.group(2)
    )


def _defined(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)  # `f = lambda x: ...`
    return names


def static_cap(question: str, answer: str) -> float:
    """The cap a Python answer's code earns by reading alone (1.0: none)."""
    code = code_text(answer)
    if not code.strip():
        return 1.0  # no code: the verifier's own checks (code_missing) judge that
    names = asked_names(question)
    if not names:
        return 1.0
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return 1.0  # not Python as written: no verdict on its names
    if not names & _defined(tree):
        return NAME_MISSING_CAP
    return 1.0


def gated(score: float, question: str, answer: str, run: ExampleRun | None) -> float:
    """``score`` within the gates: a Python code answer's static cap, and the prompt's
    stated tests where the answer ran against them (``run.tests``)."""
    if run is not None and run.tests:
        if run.tests_failed:
            return min(score, TESTS_FAILED_CAP)
        score = max(score, TESTS_HELD_FLOOR)
    return min(score, static_cap(question, answer))
