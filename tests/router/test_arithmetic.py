"""Checking the arithmetic steps of worked answers (`router.arithmetic`)."""

from __future__ import annotations

import time

import pytest

from router.arithmetic import check_arithmetic


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("3 boxes: 3 * 12 = 36 apples, 36 - 5 = 31.", (2, 0)),
        ("3 * 12 = 38 apples", (1, 1)),
        # GSM8K's calculator annotations, the right one and a wrong one.
        ("60 * 3 = <<60*3=180>>180 downloads", (1, 0)),
        ("<<180*0.7=127>>127", (1, 1)),
        # A chain: each link is a step.
        ("22 + 4 x 12 = 22 + 48 = 70 pink ones", (2, 0)),
        ("22 + 4 x 12 = 22 + 48 = 71 pink ones", (2, 1)),
        ("$1,350 + $2,100 = $3,450", (1, 0)),
        ("40% * 30 = 12", (1, 0)),
        ("100 / 3 = 33 each", (1, 0)),
        ("180 * 0.7 = 127", (1, 1)),
        ("30 \\* 0.6 = 18", (1, 0)),
        ("1/3 = 0.33", (1, 0)),  # rounded results pass
        ("2^3 = 8", (1, 0)),
        ("2/3 = 66.7%", (1, 0)),  # a bare percentage rounds in hundredths
        ("2/3 = 60%", (1, 1)),
        ("(-8)^0.5 = 2.83", (0, 0)),  # no real value: skipped, not a crash
        # A percentage is also its number of hundredths.
        ("(6 / 12) x 100 = 50%.", (1, 0)),
        ("0.5 * 100 = 40%", (1, 1)),
        # A running chain goes on from the last result: the next link is checked.
        ("90 / 450 = 0.2 * 100 = 20", (1, 0)),
        ("90 / 450 = 0.3 * 100 = 30", (2, 1)),
        # Units between a number and its operator are dropped.
        ("15 floors * 8 units/floor = 120 units", (1, 0)),
        ("15 floors * 8 units/floor * 3/4 = 36", (1, 1)),
        ("$5 per hour x 3 hours = $15", (1, 0)),
        # ...but a number before "=" that no operator leads to is a label, not a side.
        ("Day 1 total = 3 * 4 = 12 apples", (1, 0)),
        ("Becky's 10 slices + Jake's 7 slices + Silvia's 14 slices = 10 + 7 + 14 = 31", (1, 0)),
        ("20% of 20 students = 0.20 * 20 = 4 students", (1, 0)),
        ("5:00 pm - 3 hours = 2:00 pm", (0, 0)),  # a time of day, not a number
        # Two units of measure in one quantity or sum: the step is unknown, not wrong.
        ("4 feet + 3 inches = 51 inches", (0, 0)),
        ("$2 + 50 cents = $2.50", (0, 0)),
        ("1 hour + 30 minutes + 2 hours = 3.5 hours", (0, 0)),  # not "30 + 2"
        ("2 hours + 1 hour + 30 minutes = 3.5 hours", (0, 0)),  # the mixed pair second
        ("$10 - $2 - 50 cents = $7.50", (0, 0)),
        ("2 hours 30 minutes + 45 minutes = 3 hours 15 minutes", (0, 0)),
        ("5 feet 3 inches = 63 inches", (0, 0)),
        # ...while one unit, or counted things, are checked.
        ("4 hours + 2 hours = 7 hours", (1, 1)),
        ("$5 + $3 = $9", (1, 1)),
        ("10 players + 2 coaches = 12 people", (1, 0)),
        ("220 pushups + 90 squats + 60 presses = 380 activities", (1, 1)),
        # The full stop of the sentence before a step is not part of it.
        ("It takes time. 2 * 3 = 7", (1, 1)),
        # A side cut from a longer expression ("y + 7") is not known.
        ("y + 7 = 13", (0, 0)),
        ("3y - 4 = 5 * 20 - 4 = 96", (1, 0)),
        # Nothing to check: bare numbers, prose, a date, a ratio written as a label.
        ("The answer = 42", (0, 0)),
        ("x = 5 and y = 6", (0, 0)),
        ("no numbers here", (0, 0)),
    ],
)
def test_steps_are_checked(text: str, expected: tuple[int, int]) -> None:
    assert check_arithmetic(text) == expected


def test_hostile_input_is_bounded() -> None:
    """No eval: huge powers, division by zero and deep nesting are skipped, quickly."""
    hostile = "9 ** 9 ** 9 = 1, 5 / 0 = 1, " + "(" * 500 + "1" + ")" * 500 + " + 1 = 2, "
    start = time.perf_counter()
    assert check_arithmetic(hostile * 50) == (0, 0)
    assert check_arithmetic("1 + 1 = 2, " * 100_000)[0] <= 400  # chains are capped
    assert check_arithmetic("-" * 6000 + "1 = 2") == (0, 0)  # too long to be a step
    # Long runs are scanned once, not from every position.
    assert check_arithmetic("9" * 8000 + "*2 = 3") == (0, 0)
    assert check_arithmetic("1 " * 40_000) == (0, 0)
    assert check_arithmetic(("1" + " " * 5000 + "a" * 5000) * 4) == (0, 0)
    assert check_arithmetic("1 apples " * 20_000) == (0, 0)
    assert check_arithmetic("* 1 ab cd" * 20_000) == (0, 0)
    assert check_arithmetic("1 hours 2 feet " * 20_000) == (0, 0)  # compound quantities
    assert check_arithmetic("9" * 8000 + " feet") == (0, 0)
    assert check_arithmetic("$1 feet + " * 20_000) == (0, 0)  # mixed sums
    # A right side's leading number is found without rescanning its spaces.
    assert check_arithmetic("2+2 =" + " " * 8000 + "-(5+1)") == (1, 1)
    assert time.perf_counter() - start < 5.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("48 / 2 = 24. 48 + 24 = 82.", (2, 1)),  # a full stop ends a step
        ("3 * 4 = 12, 12 + 1 = 14", (2, 1)),  # so does a comma
        ("1,000 * 2 = 2,000", (1, 0)),  # a thousands separator does not
        ("2.5 * 2 = 5.", (1, 0)),
    ],
)
def test_steps_on_one_line_are_each_checked(text: str, expected: tuple[int, int]) -> None:
    assert check_arithmetic(text) == expected
