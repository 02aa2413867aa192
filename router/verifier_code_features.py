"""The verifier's reading of code answers: which languages a prompt names and an
answer's fences are tagged with, whether the code is a stub, and the features these
give (``code_features``, ``code_run_features``) to ``router.verifier_features``.
"""

from __future__ import annotations

import ast
import bisect
import io
import math
import re
import tokenize

from router.answers import FENCE, code_text
from router.code_examples import ExampleRun

# From running the answer's code against its own examples (``Signals.code_run``).
CODE_RUN_FEATURES = ("code_examples_held", "code_examples_failed_share")
# Languages other than Python (the default when none is named), by the names a prompt
# uses or an answer's code fence is tagged with; ALIASES map other spellings onto them.
OTHER_LANGUAGES = (
    "javascript", "typescript", "java", "kotlin", "scala", "groovy", "c", "c++", "c#", "f#",
    "objective-c", "go", "rust", "zig", "nim", "swift", "dart", "ruby", "php", "perl", "lua",
    "r", "julia", "matlab", "fortran", "cobol", "haskell", "ocaml", "elixir", "erlang",
    "clojure", "solidity", "sql", "bash", "powershell",
)  # fmt: skip
ALIASES = {
    "cpp": "c++",
    "csharp": "c#",
    "golang": "go",
    "js": "javascript",
    "ts": "typescript",
    "node.js": "javascript",
    "nodejs": "javascript",
    "sh": "bash",
    "shell script": "bash",
}
_OTHER_LANGUAGE_SET = frozenset(OTHER_LANGUAGES)
# Names that are also everyday words or letters ("go", "option c") are heard as written
# and next to a word that makes them a language: "in C", "a Go function", "R code".
_LETTER_NAMES = ("c", "go", "r")
# Code in an answer. An import's indent is `[^\S\n]` (`\s` but a newline): the same lines
# match as with `^\s*`, which let every line start in a run of blank lines rescan the
# rest of the run (quadratic: 42 s on 100,000 blank lines).
_CODE_SIGNS = re.compile(
    r"```|\bdef \w+\(|\bclass \w+|\[PYTHON\]|^[^\S\n]*+(?:import|from) \w+", re.M
)
_URL = re.compile(r"https?://\S++")  # "geeksforgeeks.org/x.php" names no language
_LANGUAGE_NAME = re.compile(  # in the lower-cased prompt; longest names first
    r"(?<![\w+#.-])(?:"
    + "|".join(
        re.escape(name)
        for name in sorted({*OTHER_LANGUAGES, *ALIASES} - set(_LETTER_NAMES), key=len, reverse=True)
    )
    + r")(?![a-z_+#])"
)
_LETTER_NAME = re.compile(
    r"\b(?:in|using|with|for) (C|Go|R)\b(?!\+|#)"
    r"|\b(C|Go|R)(?= (?:function|program|code|script|language|implementation|version)\b)"
)
_FUNCTION_ASKED = re.compile(r"\bfunction\b", re.IGNORECASE)
# A Python function's head, "def name(" (within one line: linear; a markdown-escaped
# "def add\\_one(" is none, it would not run), or a lambda.
_PYTHON_FUNCTION = re.compile(
    r"^[ \t]*+(?:async[ \t]++)?def[ \t]++\w++[ \t]*+\(|\blambda\b", re.MULTILINE
)
# A line that can only be a placeholder body (`pass`, `...`, `raise NotImplementedError`).
_PLACEHOLDER_LINE = re.compile(r"(?:^|:)[ \t]*(?:pass\b|\.\.\.|raise NotImplementedError\b)", re.M)
# Words of a comment that says the code is still to be written: under one, a body that
# only returns a constant (`return None  # TODO`) is a placeholder too.
_TODO = re.compile(
    r"\bTODO\b|\bFIXME\b|your (?:code|implementation) here|\bimplement (?:this|me)\b",
    re.IGNORECASE,
)


NO_CODE_FEATURES = dict.fromkeys(
    ("code_missing", "code_other_language", "code_lines", "code_no_function", "code_stub"), 0.0
)


def code_features(prompt: str, question: str, answer: str) -> dict[str, float]:
    """The answer to a code question: its code read once, the languages the prompt names
    (a system prompt too) read once and only when a check needs them."""
    code = code_text(answer)
    fenced = other_fenced(answer)
    asks_function = bool(_FUNCTION_ASKED.search(question))
    named = named_languages(prompt) if fenced or asks_function else set()
    return {
        "code_missing": float(not _CODE_SIGNS.search(answer)),
        # Fenced as a language other than Python that the prompt did not name.
        "code_other_language": float(bool(fenced - named)),
        # Long code is more often wrong (a harder task, or a detour): on the shipped MBPP
        # answers, 62% of those with <= 5 lines are right, 42% of those with > 12.
        "code_lines": math.log1p(_lines(code)),
        # Asked for a function (in Python: no other language named) and wrote no Python
        # function: on the shipped MBPP answers these are other languages' code without a
        # fence tag, or a bare expression, and 5% of them are right (52% of the rest).
        "code_no_function": float(
            asks_function and not named and not _PYTHON_FUNCTION.search(code)
        ),
        # Python whose every function is a placeholder (`pass`, `...`, `raise
        # NotImplementedError`, a docstring, or a constant returned under a TODO
        # comment): no answer yet, however well it reads.
        "code_stub": float(_only_stubs(code)),
    }


def _only_stubs(code: str) -> bool:
    """Whether `code` parses as Python, defines functions, and none has a body."""
    if "def " not in code:
        return False
    todo = _TODO.search(code) is not None
    if not (todo or _PLACEHOLDER_LINE.search(code)):  # parsing costs ~1 ms
        return False
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # not Python: no verdict
        return False
    functions = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    todo_lines = _todo_comment_lines(code) if todo else ()
    return bool(functions) and all(_placeholder_body(f, todo_lines) for f in functions)


def _todo_comment_lines(code: str) -> tuple[int, ...]:
    """The lines, in order, of the comments (real ones: not a `#` in a string) that say
    TODO."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, SyntaxError):
        return ()
    return tuple(
        t.start[0] for t in tokens if t.type == tokenize.COMMENT and _TODO.search(t.string)
    )


def _placeholder_body(
    function: ast.FunctionDef | ast.AsyncFunctionDef, todo_lines: tuple[int, ...]
) -> bool:
    if all(map(_placeholder, function.body)):
        return True
    # `return None` / `return 0` / `return []` under a TODO: a stub that only type-checks.
    *head, last = function.body
    first_todo = bisect.bisect_left(todo_lines, function.lineno)  # in or after the def
    return (
        all(map(_placeholder, head))
        and isinstance(last, ast.Return)
        and _constant(last.value)
        and first_todo < len(todo_lines)
        and todo_lines[first_todo] <= (last.end_lineno or last.lineno)
    )


def _constant(value: ast.expr | None) -> bool:
    """None, a literal (`-1` too), or an empty container: what a stub returns."""
    if isinstance(value, ast.UnaryOp) and isinstance(value.op, ast.USub | ast.UAdd):
        value = value.operand
    if value is None or isinstance(value, ast.Constant):
        return True
    if isinstance(value, ast.List | ast.Tuple | ast.Set):
        return not value.elts
    return isinstance(value, ast.Dict) and not value.keys


def _placeholder(statement: ast.stmt) -> bool:
    if isinstance(statement, ast.Pass):
        return True
    if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Constant):
        return statement.value.value is Ellipsis or isinstance(statement.value.value, str)
    return isinstance(statement, ast.Raise) and _names_not_implemented(statement.exc)


def _names_not_implemented(exc: ast.expr | None) -> bool:
    target = exc.func if isinstance(exc, ast.Call) else exc
    return isinstance(target, ast.Name) and target.id == "NotImplementedError"


def code_run_features(run: ExampleRun | None) -> dict[str, float]:
    """Whether the answer's own examples held when its code ran: on the shipped MBPP
    answers of the ten cheap models, 70% of those whose every example holds are right,
    37% of those whose every example fails. NaN (neutral) when not run or nothing to run."""
    if run is None or not run.checked:
        return dict.fromkeys(CODE_RUN_FEATURES, math.nan)
    held, failed_share = float(run.held), run.failed / run.checked
    return dict(zip(CODE_RUN_FEATURES, (held, failed_share), strict=True))


def other_fenced(answer: str) -> set[str]:
    """The languages other than Python the answer's code fences are tagged with."""
    fenced = {ALIASES.get(t.lower(), t.lower()) for t in FENCE.findall(answer) if t}
    return fenced & _OTHER_LANGUAGE_SET


def named_languages(prompt: str) -> set[str]:
    """The languages other than Python a prompt names (``OTHER_LANGUAGES`` spellings)."""
    text = _URL.sub(" ", prompt)
    names = {ALIASES.get(name, name) for name in _LANGUAGE_NAME.findall(text.lower())}
    names.update((a or b).lower() for a, b in _LETTER_NAME.findall(text))
    return names


def _lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip())
