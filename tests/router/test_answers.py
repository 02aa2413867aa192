"""Final answers and agreement between answers (`router.answers`)."""

from __future__ import annotations

import math
import time

import pytest

from router.answers import (
    MC_OPTION,
    NUMBER,
    agreement,
    agrees,
    code_agreement,
    final_answer,
    prompt_kind,
)

MC = "Which is a gas at room temperature?\nA) iron\nB) oxygen\nC) wood\nAnswer:"
MATH = "Tom has 3 boxes of 12 eggs and breaks 5. How many eggs are left?"


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("B", "B"),
        ("B\n", "B"),
        ("(B)", "B"),
        ("The answer is C.", "C"),
        ("The answer is **B**", "B"),
        ("**B**", "B"),
        ("ANSWER IS C", "C"),
        ("Answer: A", "A"),
        ("A or B, hard to say", None),  # no commitment
        ("Oxygen is a gas.", None),
        ("", None),
    ],
)
def test_the_option_an_answer_commits_to(answer: str, expected: str | None) -> None:
    assert prompt_kind(MC) == "mc"
    assert final_answer(MC, answer) == expected


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("3 * 12 = 36 eggs, 36 - 5 = 31.\n#### 31", "31"),
        ("So 31 eggs are left.", "31"),
        ("The answer is $1,250.00 after 3 weeks.", "1250"),  # the marked number, not the last
        ("\\boxed{31}", "31"),
        ("3 * 12 = 36 and 36 - 5 = 31.0", "31"),
        ("I cannot tell.", None),
    ],
)
def test_the_final_number_of_a_maths_answer(answer: str, expected: str | None) -> None:
    assert prompt_kind(MATH) == "math"
    assert final_answer(MATH, answer) == expected


def test_free_text_and_code_have_no_final_answer() -> None:
    assert final_answer("Write a poem about the sea.", "The sea, the sea.") is None
    assert final_answer("Write a python function to add two numbers.", "def f(a, b):") is None


def test_agreement_is_the_share_of_comparable_samples_that_agree() -> None:
    assert agreement(MC, "B", ["The answer is B", "B"]) == 1.0
    assert agreement(MC, "B", ["B", "C"]) == 0.5
    assert agreement(MC, "B", ["C"]) == 0.0
    # A sample without a final answer is no opinion, not a vote against.
    assert agreement(MC, "B", ["B", "I am not sure."]) == 1.0
    assert agreement(MATH, "#### 31", ["36 - 5 = 31"]) == 1.0
    assert agreement(MATH, "#### 31", ["#### 41"]) == 0.0


def test_no_opinion_is_nan() -> None:
    assert math.isnan(agreement(MC, "B", []))
    assert math.isnan(agreement(MC, "B", ["hmm"]))
    assert math.isnan(agreement(MC, "no idea", ["B"]))  # the answer itself commits to nothing
    assert math.isnan(agreement("Tell me a story.", "Once upon a time", ["Long ago"]))


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("It takes 10-12 days; the answer is 12", "12"),  # a range's hyphen is no sign
        ("Steps 1,2,3 and then 7", "7"),  # not thousands
        ("He owes -5 dollars", "-5"),
        ("The answer is 1234567", "1234567"),  # every digit counts, not 6 significant
        ("The answer is 12,445.67", "12445.67"),
        ("The answer is " + "9" * 400, None),  # overflows: no number to compare
        ("The answer is -5", "-5"),  # a sign after "answer is", not a dash
        ("The answer is 1/3.", "0.3333333333333333"),  # a fraction, not its numerator
        ("\\boxed{\\frac{3}{2}}", "1.5"),
        ("The answer is 2^10 = 1024", "1024"),  # an expression after the marker
        ("The answer is 2.5^2 = 6.25", "6.25"),
        ("So x = .5", "0.5"),
        ("The answer is 3/0", None),
    ],
)
def test_odd_numbers(answer: str, expected: str | None) -> None:
    assert final_answer(MATH, answer) == expected


def test_close_but_different_numbers_disagree() -> None:
    assert agreement(MATH, "The answer is 1234567", ["The answer is 1234569"]) == 0.0


def test_hostile_text_is_read_in_linear_time() -> None:
    """Runs of whitespace once made these patterns quadratic (minutes at this size);
    each call must come back at once."""
    blank = "\n" * 200_000
    assert final_answer(blank + "How many? 3 + 4", "answer" + " " * 100_000) is None
    assert final_answer(blank + MC, "answer" + " " * 100_000) is None
    assert final_answer(blank + MC, "B") == "B"  # the question is read from the end
    assert MC_OPTION.search(blank + "x") is None
    commas = "111," * 50_000 + "1111"  # a comma chain that ends badly
    assert final_answer(MATH, commas) is not None
    assert NUMBER.findall(commas)[-1] == "1111"
    assert agreement(blank, "B", ["B"]) != agreement(blank, "B", ["B"])  # NaN: no kind


CODE = "Write a function to remove all whitespaces from the given string."
SPLIT_JOIN = "Here:\n```python\ndef remove_spaces(text):\n    return ''.join(text.split())\n```"
SAME_IDEA = "```python\ndef remove_spaces(s):\n    return ''.join(s.split())\n```\nDone."
ELSEWHERE = (
    "```python\nimport re\n\ndef strip_all(value):\n    result = []\n    for ch in value:\n"
    "        if not ch.isspace():\n            result.append(ch)\n    return result\n```"
)


def test_a_prompt_that_asks_for_code_is_of_the_code_kind() -> None:
    assert prompt_kind(CODE) == "code"
    # Code first: a function that computes a quantity is still asked for as code.
    assert prompt_kind("Write a python function to compute the sum of 3 and 4.") == "code"
    assert prompt_kind(MATH) == "math" and prompt_kind(MC) == "mc"
    assert prompt_kind("Write a haiku about the sea.") is None
    # Loose cues give way to a maths question.
    assert prompt_kind("A python at the zoo eats 3 mice a day. How many in 7 days?") == "math"
    assert prompt_kind("Sam must complete a 12-week program. How many days is it?") == "math"
    assert prompt_kind("What is 6 times 7?") == "math"  # arithmetic in words
    assert prompt_kind("Write 6 haiku, 7 lines each, about sums.") is None


def test_code_agreement_is_how_alike_the_code_is() -> None:
    alike = code_agreement(CODE, SPLIT_JOIN, [SAME_IDEA])
    apart = code_agreement(CODE, SPLIT_JOIN, [ELSEWHERE])
    assert 0.0 <= apart < alike <= 1.0
    assert code_agreement(CODE, SPLIT_JOIN, [SPLIT_JOIN]) == 1.0
    assert code_agreement(CODE, SPLIT_JOIN, [SAME_IDEA, ELSEWHERE]) == pytest.approx(
        (alike + apart) / 2
    )
    # Code Llama's [PYTHON] tags are fences too.
    tagged = "[PYTHON]\ndef remove_spaces(text):\n    return ''.join(text.split())\n[/PYTHON]"
    assert code_agreement(CODE, tagged, [SPLIT_JOIN]) == 1.0


def test_code_agreement_is_unknown_without_code_to_compare() -> None:
    assert math.isnan(code_agreement(CODE, SPLIT_JOIN, []))
    assert math.isnan(code_agreement(CODE, "", [SPLIT_JOIN]))
    assert math.isnan(code_agreement(MC, "B", ["B"]))  # not a code question
    # Prose is not code: it would only look unlike (and escalate) for nothing.
    assert math.isnan(code_agreement(CODE, "Use str.replace.", ["Split, then join."]))
    unfenced = "def remove_spaces(text):\n    return ''.join(text.split())"
    assert code_agreement(CODE, unfenced, [SPLIT_JOIN]) == 1.0


def test_agrees_compares_what_each_kind_of_answer_has() -> None:
    assert agrees(MC, "B", "The answer is B") is True
    assert agrees(MC, "B", "C") is False
    assert agrees(MC, "B", "no idea") is None
    assert agrees(CODE, SPLIT_JOIN, SAME_IDEA) is True
    assert agrees(CODE, SPLIT_JOIN, ELSEWHERE) is False
    assert agrees("Write a haiku.", "Waves.", "Foam.") is None


def test_code_agreement_is_bounded_on_hostile_input() -> None:
    started = time.perf_counter()
    huge = "```\n" + "a(b)" * 200_000 + "\n```"
    assert 0.0 <= code_agreement(CODE, huge, [huge, "```" + "x " * 100_000]) <= 1.0
    assert time.perf_counter() - started < 5.0
