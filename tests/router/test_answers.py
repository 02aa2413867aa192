"""Final answers and agreement between answers (`router.answers`)."""

from __future__ import annotations

import math

import pytest

from router.answers import MC_OPTION, NUMBER, agreement, final_answer, is_math_prompt, is_mc_prompt

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
    assert is_mc_prompt(MC)
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
    assert is_math_prompt(MATH)
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
