"""The feature patterns stay linear on hostile text: runs of blank lines, spaces or marks.

Each case below took the old patterns from a second (where the text read is bounded)
to minutes (a run's every line start, or every position, rescanned the rest of it); now
each takes milliseconds. Nothing is timed: the old code would visibly hang here. The
properties check each new pattern against the old one, kept inline, on short random
texts: the same matches, so the same features.
"""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router.features import DENSE_NAMES, PATTERN_MARKERS, QUESTION_PATTERNS, extract
from router.open_features import _SENTENCE_END, open_features
from router.verifier_code import _ASSERT, stated_tests
from router.verifier_code_features import _CODE_SIGNS
from router.verifier_features import (
    _JSON_FENCE,
    _YES_NO_QUESTION,
    Signals,
    extract_features,
)

CODE_PROMPT = "Write a python function to double a number."
MATHS_QUESTION = "Is 7 * 8 greater than 50? Answer"
BLANK_RUNS = {
    "newlines": "\n" * 50_000,
    "space-newline": " \n" * 50_000,
    "crlf": "\r\n" * 50_000,
    "mixed": " \t\n\r\n\t \n" * 10_000,
}

# The patterns as they were (quadratic), the reference for the properties.
OLD_MC_OPTIONS = re.compile(r"^\s*\(?[A-Ea-e][.)]\s", re.MULTILINE)
OLD_OPTION = re.compile(r"^\s*\(?[A-Ea-e][.)][ \t]*(.*)$", re.MULTILINE)
OLD_CODE_SIGNS = re.compile(
    r"```|\bdef \w+\(|\bclass \w+|\[PYTHON\]|^\s*(?:import|from) \w+", re.MULTILINE
)
OLD_YES_NO_QUESTION = re.compile(
    r"\byes or no\b|\btrue or false\b|(?:^|[.!?]\s+)(?:is|are|was|were|does|do|did|can|could|"
    r"will|would|should|has|have)\b[^.!?]*\?\s*(?:answer\b[^.!?]*[.!?]?\s*)?$",
    re.IGNORECASE,
)
OLD_JSON_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL | re.IGNORECASE)
OLD_SENTENCE_END = re.compile(r"[.!?]+(?:\s|$)")
OLD_ASSERT = re.compile(r"^[ \t>]*assert[ \t]+(.+?)[ \t]*$", re.MULTILINE)

WHITESPACE = [" ", "\t", "\n", "\r", "\r\n", "\x0c", "\x0b", "\xa0"]


def texts(*pieces: str) -> st.SearchStrategy[str]:
    """Short texts of whitespace and the given pieces, in any order."""
    return st.lists(st.sampled_from([*WHITESPACE, *pieces]), max_size=30).map("".join)


def dense(prompt: str, name: str) -> float:
    return float(extract([{"role": "user", "content": prompt}]).dense[DENSE_NAMES.index(name)])


@pytest.mark.parametrize("run", BLANK_RUNS.values(), ids=BLANK_RUNS.keys())
def test_code_is_found_after_a_run_of_blank_lines(run: str) -> None:
    code = extract_features(CODE_PROMPT, f"Sure:{run}def double(x):\n    return 2*x\n", Signals())
    assert code["code_prompt"] == 1.0 and code["code_missing"] == 0.0
    imports = extract_features(CODE_PROMPT, f"Sure:{run}\t import math\n", Signals())
    assert imports["code_missing"] == 0.0  # an indented import after "\r\n" lines too
    prose = extract_features(CODE_PROMPT, f"4{run}4", Signals())
    assert prose["code_missing"] == 1.0


@pytest.mark.parametrize("run", BLANK_RUNS.values(), ids=BLANK_RUNS.keys())
def test_options_are_counted_after_a_run_of_blank_lines(run: str) -> None:
    assert dense(f"Summarise this:\n{run}the end", "log_mc_options") == 0.0
    # The conversation is read at its head and tail: the options are in the tail.
    options = f"Context.{run}Which is right?\nA) one\n\t(b) two\r\n  C. three"
    assert dense(options, "log_mc_options") == pytest.approx(math.log1p(3))
    assert dense(options, "q_log_options") == pytest.approx(math.log1p(3))


def test_a_yes_no_question_followed_by_a_run_of_spaces_is_read() -> None:
    # Not one: the "answer ..." part goes on after its full stop (the old pattern backtracked
    # over the spaces, quadratically, to find that out); a bare "Yes." gives no number.
    question = f"{MATHS_QUESTION}{' ' * 50_000}with 7 * 8 worked out. Then check it."
    features = extract_features(question, "Yes.", Signals())
    assert features["math_prompt"] == 1.0 and features["math_no_number"] == 1.0
    # One: "Yes." answers it.
    question = f"{MATHS_QUESTION}{' ' * 50_000}with 7 * 8 = 56 in mind"
    assert extract_features(question, "Yes.", Signals())["math_no_number"] == 0.0


@pytest.mark.parametrize("run", [" " * 50_000, *BLANK_RUNS.values()], ids=["spaces", *BLANK_RUNS])
def test_a_json_fence_after_a_run_of_whitespace_is_read(run: str) -> None:
    prompt = "Respond in JSON."
    unclosed = extract_features(prompt, f'```json{run}{{"a": 1}}', Signals())
    assert unclosed["json_requested"] == 1.0 and unclosed["json_invalid"] == 1.0
    closed = extract_features(prompt, f'```json{run}{{"a": 1}}\n```', Signals())
    assert closed["json_invalid"] == 0.0


@pytest.mark.parametrize("mark", [".", "!", "?"])
def test_sentences_are_counted_past_a_long_run_of_marks(mark: str) -> None:
    # The run (within the 8,000 characters read) ends no sentence: a letter follows it.
    answer = f"One{mark * 7_900}two. Three."
    assert open_features("Answer in 2 sentences.", answer)["constraints_broken"] == 0.0
    assert open_features("Answer in 5 sentences.", answer)["constraints_broken"] == 1.0


def _same_ends(old: re.Pattern[str], new: re.Pattern[str], text: str) -> None:
    """Same matches but for the start: the old one also took the blank lines before."""
    pairs = list(zip(old.finditer(text), new.finditer(text), strict=True))
    for was, now in pairs:
        assert was.end() == now.end() and was.groups() == now.groups()
        assert was.start() <= now.start() and not text[was.start() : now.start()].strip()


@given(texts("A", "b", "e", "f", "(", ")", ".", ":", "x"))
def test_option_patterns_match_as_before(text: str) -> None:
    _same_ends(OLD_MC_OPTIONS, PATTERN_MARKERS["mc_options"], text)
    _same_ends(OLD_OPTION, QUESTION_PATTERNS["option"], text)


@given(texts("import x", "from y", "def f(", "class C", "```", "[PYTHON]", "x"))
def test_the_code_sign_pattern_matches_as_before(text: str) -> None:
    assert bool(_CODE_SIGNS.search(text)) == bool(OLD_CODE_SIGNS.search(text))
    _same_ends(OLD_CODE_SIGNS, _CODE_SIGNS, text)


@given(texts("Is it", "are", "?", "answer", "yes", ".", "!", "x"))
def test_the_yes_no_pattern_matches_as_before(text: str) -> None:
    was, now = OLD_YES_NO_QUESTION.search(text), _YES_NO_QUESTION.search(text)
    assert (was.span() if was else None) == (now.span() if now else None)


@given(texts("```", "json", "JSON", "{", "}", "x"))
def test_the_json_fence_pattern_matches_as_before(text: str) -> None:
    assert _JSON_FENCE.findall(text) == OLD_JSON_FENCE.findall(text)


@given(texts(".", "!", "?", "...", "x", "y"))
def test_the_sentence_end_pattern_matches_as_before(text: str) -> None:
    spans = [m.span() for m in _SENTENCE_END.finditer(text)]
    assert spans == [m.span() for m in OLD_SENTENCE_END.finditer(text)]


def test_a_stated_test_is_read_past_a_run_of_spaces() -> None:
    question = "Write f.\nassert f(1) == 2" + " " * 50_000 + "\nassert f(2) == 3   "
    assert stated_tests(question) == (("f(1)", "2"), ("f(2)", "3"))


@given(texts("assert", "assert ", ">", "f(1) == 2", "x", "="))
def test_the_assert_pattern_reads_the_same_tests(text: str) -> None:
    """As before, but for a line whose test is blank (`assert   `), now no test at all."""
    was = [test for test in OLD_ASSERT.findall(text) if test.strip(" \t")]
    assert _ASSERT.findall(text) == was
