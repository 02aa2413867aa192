"""Cascade verifier: how likely a cheap model's answer is acceptable.

The score is a logistic model over cheap text signals (format consistency, refusals,
truncation, requested JSON, repetition, token logprobs), followed by hard caps for
answers that are unusable whatever the model says (empty, invalid requested JSON).
That judges closed-form answers (an option letter, a word problem's number, a function);
an open-ended prompt (``router.open_verifier.judges``: chat, writing, code help) is
judged by the model of ``router.open_verifier`` instead, learned from graded chat answers.
The weights live in ``router/models/verifier.json`` (plain JSON, built by
``router.verifier_train``); scoring needs only the standard library.

Usage::

    verifier = Verifier.load()
    verifier.score("What is 2 + 3?", "2 + 3 = 5", finish_reason="stop")

Errors raised here are ``RoutingError`` (a missing or malformed artifact).
"""

from __future__ import annotations

import ast
import bisect
import io
import json
import math
import re
import tokenize
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router import code_examples, verifier_code
from router.answers import (
    FENCE,
    MC_OPTION,
    NUMBER,
    PromptKind,
    agreement,
    chosen_options,
    code_agreement,
    code_text,
    final_number,
    parse_number,
    prompt_kind,
)
from router.arithmetic import check_arithmetic
from router.artifacts import read_artifact
from router.code_examples import CodeJob, ExampleRun
from router.errors import RoutingError
from router.open_features import OPEN_FEATURES
from router.open_verifier import OpenVerifier, judges
from router.text import head_and_tail

DEFAULT_PATH = Path(__file__).resolve().parent / "models" / "verifier.json"
# /2 adds the open-ended model (the "open_ended" section) to /1's closed-form one; a /1
# artifact still loads, and judges every answer as closed-form.
ARTIFACT_FORMAT = "cascade-verifier/2"
CLOSED_FORM_FORMAT = "cascade-verifier/1"

# Order is the artifact's column order; changing it means retraining.
# From running the answer's code against its own examples (``Signals.code_run``).
CODE_RUN_FEATURES = ("code_examples_held", "code_examples_failed_share")
FEATURE_NAMES: tuple[str, ...] = (
    "empty",
    "very_short",
    "log_answer_chars",
    "finish_length",
    "ends_mid_sentence",
    "unbalanced_fences",
    "unbalanced_brackets",
    "refusal",
    "hedge",
    "json_requested",
    "json_invalid",
    "json_schema_mismatch",
    "mc_prompt",
    "mc_no_clear_option",
    "math_prompt",
    "math_no_number",
    "math_final_marker",
    "code_prompt",
    "code_missing",
    "code_other_language",
    "code_lines",
    "code_no_function",
    "code_stub",
    "repetition",
    "degenerate_loop",
    "no_logprobs",
    "logprob_mean",
    "logprob_min",
    "logprob_low_share",
    "math_steps",
    "math_wrong_step",
    "math_unused_numbers",
    "math_final_not_derived",
    "math_fractional_count",
    "prompt_difficulty",
    "sample_agreement",
    "code_agreement",
    *CODE_RUN_FEATURES,
)

# Hard rules: when the feature is set, the score is at most this value.
SCORE_CAPS: dict[str, float] = {
    "empty": 0.01,
    "json_invalid": 0.05,
    "json_schema_mismatch": 0.1,
    "refusal": 0.2,
    "finish_length": 0.3,
    "math_no_number": 0.3,
    "degenerate_loop": 0.3,
    "code_stub": 0.2,
}
# Hard rules on maths questions only (`math_prompt`): a wrong arithmetic step. On the
# shipped GSM8K answers 14% of those with one are right (75% of all); in code answers
# the step check misreads assignments (56% right, as the rest), so there it only weighs.
MATH_SCORE_CAPS: dict[str, float] = {"math_wrong_step": 0.3}

MAX_ANALYSED_CHARS = 4000  # word and repetition statistics look at the head only
# A long prompt is read at its head (a system prompt) and tail (the question): its scans
# stay bounded (unbounded, a 4 MB conversation took 1.1 s). Training prompts are shorter.
MAX_PROMPT_CHARS = 16_000
MAX_ARITHMETIC_CHARS = 8000  # worked steps are checked in the head of long answers
BARE_ANSWER_WORDS = 8  # up to this, an answer without worked steps is a bare answer
LOW_LOGPROB = math.log(0.1)  # a token the model gave under 10% probability
# Logprob features are centred on typical values so that "absent" (0.0) is neutral.
TYPICAL_MEAN_LOGPROB = -0.3
TYPICAL_MIN_LOGPROB = -4.0
TYPICAL_LOW_SHARE = 0.05

JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "object": dict,
    "array": list,
    "string": str,
    "number": (int, float),
    "integer": int,
    "boolean": bool,
    "null": type(None),
}
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

# An answer that opens by declining. "Unfortunately" only before "I" (the shipped data's
# cut-off "Unfortunately I"; "Unfortunately for Pluto fans, no." answers), and "I do not"
# only as not having or knowing ("I don't think so; it is 4" answers).
_REFUSAL = re.compile(
    r"^\W*(?:i'?m sorry|i am sorry|sorry,|i apologi[sz]e|as an ai\b|unfortunately,? i\b|"
    r"i (?:cannot|can'?t|can not|won'?t|will not|am unable|am not able)\b|"
    r"i'?m (?:unable|not able)\b|i (?:do not|don'?t) (?:have|know)\b)"
)
_AS_AN_AI = re.compile(r"\bas an ai(?: language model)?\b")
_HEDGE = re.compile(
    r"\b(i'?m not sure|i am not sure|not certain|it depends|hard to say|difficult to say|"
    r"cannot be determined|can'?t be determined|unclear|i'?m not able to)\b"
)
_PLAIN_NUMBER = re.compile(r"\d+(?:\.\d+)?")
# A maths answer without digits may still give a number ("Four.") or answer a yes/no
# question ("Is 7 * 8 greater than 50?" "Yes.").
_NUMBER_WORD = re.compile(
    r"\b(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|"
    r"fourteen|fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|"
    r"seventy|eighty|ninety|hundred|thousand|million|billion|half|quarter|none)\b",
    re.IGNORECASE,
)
_YES_NO_QUESTION = re.compile(
    r"\byes or no\b|\btrue or false\b|(?:^|[.!?]\s+)(?:is|are|was|were|does|do|did|can|could|"
    r"will|would|should|has|have)\b[^.!?]*\?\s*(?:answer\b[^.!?]*[.!?]?\s*)?$",
    re.IGNORECASE,
)
_STEP_RESULT = re.compile(r"=\s*\$?(-?\d[\d,]*(?:\.\d+)?)")  # what a worked step computed
_COUNT_QUESTION = re.compile(r"\bhow many\b", re.IGNORECASE)
_FINAL_MARKER = re.compile(r"####|\\boxed|answer is|answer:|final answer|total of|= *\$?\d")
_CODE_SIGNS = re.compile(r"```|\bdef \w+\(|\bclass \w+|\[PYTHON\]|^\s*(?:import|from) \w+", re.M)
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
_JSON_PROMPT = re.compile(r"\bjson\b", re.IGNORECASE)
# A prompt that asks for JSON output, not one about JSON ("What is JSON?", "parse JSON in
# Python"): "respond in JSON", "return it as a JSON object", "valid JSON", "JSON only".
_JSON_REQUEST = re.compile(
    r"\b(?:respond|reply|answer|output|return|give|provide|format|write|produce|generate|"
    r"print|emit|express)\w*\b[^.?!\n]{0,60}?\b(?:in|as|with|using|into)\s+"
    r"(?:(?:a|an|the|valid|strict|proper|pure|plain)\s+)*json\b"
    r"|\bvalid json\b|\bjson only\b|\bonly (?:valid )?json\b"
    r"|\bjson (?:object|array)s? (?:with|that|containing)\b|\bfollowing json schema\b",
    re.IGNORECASE,
)
# An answer that tries to be JSON: it opens with an object or array, or a json fence.
_JSON_ATTEMPT = re.compile(r"^\s*[\[{]|```json", re.IGNORECASE)
_JSON_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
_WORD = re.compile(r"\w+")
_TERMINAL = frozenset(".!?)]}\"'`*:;>")
_BRACKETS = {"(": ")", "[": "]", "{": "}"}
# A line that can only be a placeholder body (`pass`, `...`, `raise NotImplementedError`).
_PLACEHOLDER_LINE = re.compile(r"(?:^|:)[ \t]*(?:pass\b|\.\.\.|raise NotImplementedError\b)", re.M)
# Words of a comment that says the code is still to be written: under one, a body that
# only returns a constant (`return None  # TODO`) is a placeholder too.
_TODO = re.compile(
    r"\bTODO\b|\bFIXME\b|your (?:code|implementation) here|\bimplement (?:this|me)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Signals:
    """What a verifier sees besides the text: the upstream's metadata."""

    logprobs: Sequence[float] | None = None
    response_format: Mapping[str, Any] | None = None
    finish_reason: str | None = None
    # The complexity classifier's score of the prompt: on answers whose text says
    # nothing (a bare option letter), how hard the question is decides the order.
    prompt_score: float | None = None
    # Other answers to the same request (second opinions, or more samples of the same
    # model): agreeing on the final answer (or code alike) is evidence the answer is right.
    samples: Sequence[str] = ()
    # The question itself (a chat's user turns), where its kind and numbers are read;
    # None or empty: the prompt. A route's system prompt ("put code in ``` fences") is
    # shared by every request on the route and says nothing about what this one asks.
    question: str | None = None
    # The answer's code run against the examples it claims (`router.sandbox`, where the
    # route or caller switches it on); None: not run, the two features unknown.
    code_run: ExampleRun | None = None


def extract_features(prompt: str, response: str, signals: Signals) -> dict[str, float]:
    """All verifier features for one answer, keyed by ``FEATURE_NAMES``."""
    answer = response.strip()
    lowered = answer.lower().replace("\u2019", "'")
    words = _WORD.findall(lowered[:MAX_ANALYSED_CHARS])
    prompt = head_and_tail(prompt, MAX_PROMPT_CHARS)
    question = head_and_tail(signals.question, MAX_PROMPT_CHARS) if signals.question else prompt
    kind = prompt_kind(question)
    features = {
        **_length_features(prompt, answer, len(words)),
        **_truncation_features(answer, len(words), signals.finish_reason),
        "refusal": float(bool(_REFUSAL.match(lowered) or _AS_AN_AI.search(lowered))),
        "hedge": float(bool(_HEDGE.search(lowered))),
        **_json_features(prompt, answer, signals.response_format, kind),
        **_format_features(prompt, question, answer, kind),
        **_repetition_features(words, lowered[:MAX_ANALYSED_CHARS]),
        **_logprob_features(signals.logprobs),
        **_arithmetic_features(question, answer, kind),
        "prompt_difficulty": _logit(signals.prompt_score),
        # NaN (neutral) without samples, or when no final answers can be compared.
        "sample_agreement": agreement(question, answer, signals.samples),
        "code_agreement": code_agreement(question, answer, signals.samples),
        **_code_run_features(signals.code_run),
    }
    return {name: features[name] for name in FEATURE_NAMES}


def _length_features(prompt: str, answer: str, words: int) -> dict[str, float]:
    # The answer's own length only: its length relative to the prompt would smuggle in
    # the prompt's length, a prompt-level signal that prompt_difficulty carries.
    short = words < 3 and not MC_OPTION.search(prompt)
    return {
        "empty": float(not answer),
        "very_short": float(bool(answer) and short),
        "log_answer_chars": math.log1p(len(answer)),
    }


def _truncation_features(answer: str, words: int, finish_reason: str | None) -> dict[str, float]:
    long_form = words >= 8
    mid_sentence = long_form and answer[-1] not in _TERMINAL and not answer[-1].isdigit()
    return {
        "finish_length": float(finish_reason == "length"),
        "ends_mid_sentence": float(mid_sentence),
        "unbalanced_fences": float(answer.count("```") % 2 == 1),
        "unbalanced_brackets": float(_brackets_unbalanced(_code_text(answer))),
    }


def _code_text(answer: str) -> str:
    """The fenced code if there is any (prose often has stray ``1)`` list markers)."""
    parts = answer.split("```")
    return "".join(parts[1::2]) if len(parts) > 1 else answer


def _brackets_unbalanced(text: str) -> bool:
    """Counts, not nesting order: a C-speed check that catches cut-off code."""
    return any(text.count(opener) != text.count(closer) for opener, closer in _BRACKETS.items())


def _json_features(
    prompt: str, answer: str, response_format: Mapping[str, Any] | None, prompt_kind: PromptKind
) -> dict[str, float]:
    kind = (response_format or {}).get("type")
    strict = kind in ("json_object", "json_schema")
    # Asked for JSON, or a prompt that names JSON answered with an attempt at it; on a
    # code question ("write a Python function that returns JSON") the answer is code.
    requested = strict or (
        prompt_kind != "code"
        and (
            bool(_JSON_REQUEST.search(prompt))
            or bool(_JSON_ATTEMPT.search(answer) and _JSON_PROMPT.search(prompt))
        )
    )
    if not requested:
        return {"json_requested": 0.0, "json_invalid": 0.0, "json_schema_mismatch": 0.0}
    parsed, ok = _parse_json(answer, lenient=not strict)
    schema = _schema_of(response_format) if ok else None
    mismatch = (kind == "json_object" and not isinstance(parsed, dict)) or (
        schema is not None and not schema_matches(parsed, schema)
    )
    return {
        "json_requested": 1.0,
        "json_invalid": float(not ok),
        "json_schema_mismatch": float(ok and mismatch),
    }


def _parse_json(answer: str, *, lenient: bool) -> tuple[Any, bool]:
    """Parse the answer; ``lenient`` also accepts JSON inside a code fence."""
    candidates = [answer]
    if lenient:
        candidates += [match.strip() for match in _JSON_FENCE.findall(answer)]
    for text in candidates:
        try:
            return json.loads(text), True
        except (ValueError, RecursionError):  # nested past the parser's depth: not usable
            continue
    return None, False


def _schema_of(response_format: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if not response_format or response_format.get("type") != "json_schema":
        return None
    wrapper = response_format.get("json_schema") or {}
    schema = wrapper.get("schema") if isinstance(wrapper, Mapping) else None
    return schema if isinstance(schema, Mapping) else None


def schema_matches(value: Any, schema: Mapping[str, Any]) -> bool:
    """A minimal JSON Schema check: top-level ``type``, ``required`` keys, property types."""
    if not _type_matches(value, schema.get("type")):
        return False
    if not isinstance(value, dict):
        return True
    if any(key not in value for key in schema.get("required", ())):
        return False
    properties = schema.get("properties") or {}
    return all(
        _type_matches(value[key], sub.get("type"))
        for key, sub in properties.items()
        if key in value and isinstance(sub, Mapping)
    )


def _type_matches(value: Any, expected: Any) -> bool:
    if expected is None:
        return True
    names = expected if isinstance(expected, list) else [expected]
    return any(_is_json_type(value, name) for name in names)


def _is_json_type(value: Any, name: str) -> bool:
    python_type = JSON_TYPES.get(name)
    if python_type is None or not isinstance(value, python_type):
        return False
    # bool is an int subclass in Python but not a JSON number.
    return not (isinstance(value, bool) and name in ("number", "integer"))


def _format_features(prompt: str, question: str, answer: str, kind: PromptKind) -> dict[str, float]:
    mc, math_prompt, code = kind == "mc", kind == "math", kind == "code"
    return {
        "mc_prompt": float(mc),
        "mc_no_clear_option": float(mc and len(chosen_options(answer)) != 1),
        "math_prompt": float(math_prompt),
        "math_no_number": float(
            math_prompt
            and not NUMBER.search(answer)
            and not _NUMBER_WORD.search(answer)
            and not _YES_NO_QUESTION.search(_last_block(question))
        ),
        "math_final_marker": float(math_prompt and bool(_FINAL_MARKER.search(answer.lower()))),
        "code_prompt": float(code),
        **(_code_features(prompt, question, answer) if code else NO_CODE_FEATURES),
    }


NO_CODE_FEATURES = dict.fromkeys(
    ("code_missing", "code_other_language", "code_lines", "code_no_function", "code_stub"), 0.0
)


def _code_features(prompt: str, question: str, answer: str) -> dict[str, float]:
    """The answer to a code question: its code read once, the languages the prompt names
    (a system prompt too) read once and only when a check needs them."""
    code = code_text(answer)
    other_fenced = _other_fenced(answer)
    asks_function = bool(_FUNCTION_ASKED.search(question))
    named = _named_languages(prompt) if other_fenced or asks_function else set()
    return {
        "code_missing": float(not _CODE_SIGNS.search(answer)),
        # Fenced as a language other than Python that the prompt did not name.
        "code_other_language": float(bool(other_fenced - named)),
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


def _code_run_features(run: ExampleRun | None) -> dict[str, float]:
    """Whether the answer's own examples held when its code ran: on the shipped MBPP
    answers of the ten cheap models, 70% of those whose every example holds are right,
    37% of those whose every example fails. NaN (neutral) when not run or nothing to run."""
    if run is None or not run.checked:
        return dict.fromkeys(CODE_RUN_FEATURES, math.nan)
    held, failed_share = float(run.held), run.failed / run.checked
    return dict(zip(CODE_RUN_FEATURES, (held, failed_share), strict=True))


def asks_for_python(prompt: str, question: str | None = None) -> bool:
    """A question that asks for code, no other language named (in Python, then); read
    at its head and tail, as ``extract_features`` reads it."""
    prompt = head_and_tail(prompt, MAX_PROMPT_CHARS)
    question = head_and_tail(question, MAX_PROMPT_CHARS) if question else prompt
    return prompt_kind(question) == "code" and not _named_languages(prompt)


def code_job(prompt: str, response: str, question: str | None = None) -> CodeJob | None:
    """What to run to check ``response``'s code (``router.sandbox.run_examples``): the
    tests the question states, then the examples the answer claims, on a question that
    asks for code in Python; None otherwise."""
    if _other_fenced(response) or not asks_for_python(prompt, question):
        return None
    tests = verifier_code.stated_tests(head_and_tail(question or prompt, MAX_PROMPT_CHARS))
    return code_examples.code_job(response, tests)


def _other_fenced(answer: str) -> set[str]:
    """The languages other than Python the answer's code fences are tagged with."""
    fenced = {ALIASES.get(t.lower(), t.lower()) for t in FENCE.findall(answer) if t}
    return fenced & _OTHER_LANGUAGE_SET


def _named_languages(prompt: str) -> set[str]:
    """The languages other than Python a prompt names (``OTHER_LANGUAGES`` spellings)."""
    text = _URL.sub(" ", prompt)
    names = {ALIASES.get(name, name) for name in _LANGUAGE_NAME.findall(text.lower())}
    names.update((a or b).lower() for a, b in _LETTER_NAME.findall(text))
    return names


def _lines(code: str) -> int:
    return sum(1 for line in code.splitlines() if line.strip())


def _repetition_features(words: list[str], lowered: str) -> dict[str, float]:
    grams = [tuple(words[i : i + 4]) for i in range(len(words) - 3)]
    repeated = 1.0 - len(set(grams)) / len(grams) if len(grams) >= 20 else 0.0
    lines = [line.strip() for line in lowered.splitlines() if len(line.strip()) > 10]
    most = max(Counter(lines).values(), default=0)
    return {"repetition": repeated, "degenerate_loop": float(most >= 4 or repeated > 0.6)}


def _logprob_features(logprobs: Sequence[float] | None) -> dict[str, float]:
    # A log probability is at most 0: a larger one (a broken upstream) counts as certain.
    values = [min(0.0, max(-20.0, float(v))) for v in logprobs or () if math.isfinite(v)]
    if not values:
        return {
            "no_logprobs": 1.0,
            "logprob_mean": 0.0,
            "logprob_min": 0.0,
            "logprob_low_share": 0.0,
        }
    low_share = sum(v < LOW_LOGPROB for v in values) / len(values)
    return {
        "no_logprobs": 0.0,
        "logprob_mean": sum(values) / len(values) - TYPICAL_MEAN_LOGPROB,
        "logprob_min": max(-10.0, min(values)) - TYPICAL_MIN_LOGPROB,
        "logprob_low_share": low_share - TYPICAL_LOW_SHARE,
    }


def _arithmetic_features(prompt: str, answer: str, kind: PromptKind) -> dict[str, float]:
    """Worked steps checked (``router.arithmetic``) and, on maths questions: the share
    of the question's numbers the answer never uses (a skipped fact), a final answer
    that no step computed (worked steps, then a number from nowhere), and a fractional
    answer to "how many" (a count)."""
    head = answer[:MAX_ARITHMETIC_CHARS]
    checked, wrong = check_arithmetic(head)
    features = {
        "math_steps": math.log1p(checked),
        "math_wrong_step": float(wrong > 0),
        "math_unused_numbers": 0.0,
        "math_final_not_derived": 0.0,
        "math_fractional_count": 0.0,
    }
    if kind != "math":
        return features
    question = _numbers(_last_block(prompt))
    # A bare answer ("4" to "What is 2 + 2?") restates none of the question's numbers by
    # nature: only an answer that shows its working can skip a fact.
    bare = checked == 0 and len(head.split()) <= BARE_ANSWER_WORDS
    if question and not bare:
        features["math_unused_numbers"] = len(question - _numbers(head)) / len(question)
    value = final_number(head)
    if value is not None:
        results = {parse_number(m) for m in _STEP_RESULT.findall(head)}
        derived = value in results or value in question
        features["math_final_not_derived"] = float(bool(results) and not derived)
        counts = bool(_COUNT_QUESTION.search(_last_block(prompt)))
        features["math_fractional_count"] = float(counts and value != round(value))
    return features


def _last_block(prompt: str) -> str:
    """The question: the last blank-line-separated block (few-shot examples come first)."""
    blocks = [block for block in prompt.split("\n\n") if block.strip()]
    return blocks[-1] if blocks else prompt


def _numbers(text: str) -> set[float]:
    return {float(match) for match in _PLAIN_NUMBER.findall(text.replace(",", ""))}


def _logit(probability: float | None) -> float:
    """The classifier score on the logit scale; NaN (treated as "unknown") when absent."""
    if probability is None or not math.isfinite(probability):
        return math.nan
    p = min(max(probability, 1e-6), 1.0 - 1e-6)
    return math.log(p / (1.0 - p))


@dataclass(frozen=True)
class Verifier:
    """A logistic model over ``FEATURE_NAMES`` plus the hard ``SCORE_CAPS`` for
    closed-form answers, and ``open_model`` for open-ended ones (without one, every
    answer is judged as closed-form)."""

    feature_names: tuple[str, ...]
    coefficients: tuple[float, ...]
    intercept: float
    means: tuple[float, ...]
    scales: tuple[float, ...]
    threshold: float = 0.5
    open_model: OpenVerifier | None = None

    def __post_init__(self) -> None:
        if self.feature_names != FEATURE_NAMES:
            raise RoutingError(
                f"verifier artifact has features {list(self.feature_names)}; "
                f"this code expects {list(FEATURE_NAMES)} (retrain the verifier)"
            )
        sizes = {len(self.coefficients), len(self.means), len(self.scales)}
        if sizes != {len(FEATURE_NAMES)}:
            raise RoutingError(f"verifier artifact has vectors of sizes {sorted(sizes)}")
        known = {*FEATURE_NAMES, *OPEN_FEATURES}
        unknown = (
            [n for n in self.open_model.feature_names if n not in known] if self.open_model else []
        )
        if unknown:
            raise RoutingError(
                f"the open-ended verifier has features {unknown} this code does not compute "
                "(retrain the verifier)"
            )

    @classmethod
    def load(cls, path: Path | None = None) -> Verifier:
        """Load the JSON artifact (the shipped one by default)."""
        return cls.from_dict(read_artifact(path or DEFAULT_PATH, "verifier artifact"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verifier:
        if data.get("format") not in (CLOSED_FORM_FORMAT, ARTIFACT_FORMAT):
            raise RoutingError(
                f"verifier format is {data.get('format')!r}; want {ARTIFACT_FORMAT!r} "
                "(retrain the verifier: router train-verifier)"
            )
        opened = data.get("open_ended") if data["format"] == ARTIFACT_FORMAT else None
        try:
            return cls(
                feature_names=tuple(data["feature_names"]),
                coefficients=tuple(float(v) for v in data["coefficients"]),
                intercept=float(data["intercept"]),
                means=tuple(float(v) for v in data["means"]),
                scales=tuple(float(v) for v in data["scales"]),
                threshold=float(data.get("threshold", 0.5)),
                open_model=OpenVerifier.from_dict(opened) if opened is not None else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RoutingError(f"verifier artifact is malformed: {exc!r}") from exc

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": ARTIFACT_FORMAT if self.open_model else CLOSED_FORM_FORMAT,
            "feature_names": list(self.feature_names),
            "coefficients": list(self.coefficients),
            "intercept": self.intercept,
            "means": list(self.means),
            "scales": list(self.scales),
            "threshold": self.threshold,
            **({"open_ended": self.open_model.to_dict()} if self.open_model else {}),
        }

    def score(
        self,
        prompt: str,
        response: str,
        *,
        logprobs: list[float] | None = None,
        response_format: dict[str, Any] | None = None,
        finish_reason: str | None = None,
        prompt_score: float | None = None,
        samples: Sequence[str] = (),
        question: str | None = None,
        code_run: ExampleRun | None = None,
    ) -> float:
        """The probability in [0, 1] that ``response`` is an acceptable answer to ``prompt``;
        ``prompt_score`` is the complexity classifier's score of the prompt, if known;
        ``samples`` are other answers to the same prompt (second opinions), if any;
        ``question`` is the part of the prompt that asks (``Signals.question``);
        ``code_run``: its code run against its own examples (``code_job``), if it was."""
        signals = Signals(
            logprobs, response_format, finish_reason, prompt_score, samples, question, code_run
        )
        features = extract_features(prompt, response, signals)
        asked = head_and_tail(question or prompt, MAX_PROMPT_CHARS)  # as extract_features reads it
        if self.open_model is not None and judges(asked):
            score = self.open_model.score(asked, response, features)
        else:
            score = self.score_features(features)
        if features["code_prompt"] and not features["code_other_language"]:
            return verifier_code.gated(score, asked, response, code_run)
        return score

    def score_features(self, features: Mapping[str, float]) -> float:
        logit = self.intercept
        for name, coef, mean, scale in zip(
            self.feature_names, self.coefficients, self.means, self.scales, strict=True
        ):
            value = features[name]
            if not math.isnan(value):  # unknown (no prompt score, no samples): neutral
                logit += coef * (value - mean) / scale
        probability = 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, logit))))
        caps = [cap for name, cap in SCORE_CAPS.items() if features[name] > 0]
        if features["math_prompt"] > 0:
            caps += [cap for name, cap in MATH_SCORE_CAPS.items() if features[name] > 0]
        return min([probability, *caps])
