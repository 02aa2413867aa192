"""Gates on code answers from what the prompt states: the function it names, its tests."""

from __future__ import annotations

import pytest

from router import verifier_code
from router.code_examples import ExampleRun
from router.verifier import Verifier, code_job

PROMPT = (
    "Write a python function to add two numbers.\n"
    "assert add(2, 3) == 5\nassert not add(0, 0)\nassert set(pair(1)) == set([1, 2])"
)
RIGHT = "```python\ndef add(a, b):\n    return a + b\n```"


def test_stated_tests_become_examples() -> None:
    assert verifier_code.stated_tests(PROMPT) == (
        ("add(2, 3)", "5"),
        ("bool(add(0, 0))", "False"),
        ("bool(set(pair(1)) == set([1, 2]))", "True"),
    )


@pytest.mark.parametrize(
    ("prompt", "names"),
    [
        (PROMPT, {"add", "pair"}),
        ("Write a function `is_prime` that tests n.", {"is_prime"}),
        ("Write a function named count_vowels.", {"count_vowels"}),
        ("Write a function to find the area of a square.", set()),  # MBPP's shape
    ],
)
def test_asked_names(prompt: str, names: set[str]) -> None:
    assert verifier_code.asked_names(prompt) == names


def test_the_prompts_tests_run_first_with_the_answers_examples() -> None:
    answer = RIGHT.replace("\n```", "\n\nprint(add(1, 1))  # Output: 2\n```")
    job = code_job(PROMPT, answer)
    assert job is not None and job.stated == 3
    assert job.examples[3] == ("add(1, 1)", "2")


def test_gates() -> None:
    verifier = Verifier.load()
    held, failed = ExampleRun(3, 0, 3, 0), ExampleRun(2, 1, 3, 1)
    assert verifier.score(PROMPT, RIGHT, code_run=held) >= verifier_code.TESTS_HELD_FLOOR
    assert verifier.score(PROMPT, RIGHT, code_run=failed) <= verifier_code.TESTS_FAILED_CAP
    wrong_name = RIGHT.replace("def add", "def plus")
    assert verifier.score(PROMPT, wrong_name) <= verifier_code.NAME_MISSING_CAP
    # The answer's own examples alone (no stated tests) leave the learned weights to judge.
    assert verifier.score(PROMPT, RIGHT, code_run=ExampleRun(1, 0)) < 1.0
