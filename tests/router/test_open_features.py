"""Which prompts are open-ended, and the signals of an open-ended answer."""

from __future__ import annotations

import time

import pytest

from router.answers import open_ended
from router.open_features import OPEN_FEATURES, open_features


@pytest.mark.parametrize(
    ("prompt", "expected"),
    [
        # Closed-form: lettered options, word problems, short function requests.
        ("Which gas do plants absorb?\nA) oxygen\nB) carbon dioxide\nAnswer:", False),
        ("Tom has 3 boxes with 12 apples each. He eats 5. How many apples are left?", False),
        ("Grace weighs 125 pounds. Alex weighs 2 pounds less than 4 times that. "
         "What are their combined weights in pounds?", False),
        ("John likes a glass of water with each meal and one before bed. How many "
         "glasses of water does John drink in a week?", False),  # number words count
        ("Write a function to remove all elements from a list present in another list.", False),
        # Open-ended: chat, writing, explanations, code help.
        ("What is the capital of France?", True),
        ("hi", True),
        ("Explain how TCP congestion control works.", True),
        ("Write a story with 3 characters about how many stars there are.", True),
        ("Write a Python script that renames 1000 files.\n\nUse pathlib.", True),
        ("Solve this:\n\nx + 3 = 5. What is x?", True),  # not one plain paragraph
        ("Explain this code:\n```python\nx = 1\n```", True),
    ],
)  # fmt: skip
def test_open_ended_prompts_are_told_from_closed_form_ones(prompt: str, expected: bool) -> None:
    assert open_ended(prompt) is expected


def test_the_rule_reads_a_long_prompt_at_its_end_in_bounded_time() -> None:
    long = "lorem ipsum dolor " * 300_000 + "How many apples are left if I had 3?"
    start = time.perf_counter()
    assert open_ended(long) is True  # a long conversation is no word problem
    assert time.perf_counter() - start < 0.5


def features(prompt: str, answer: str) -> dict[str, float]:
    values = open_features(prompt, answer)
    assert tuple(values) == OPEN_FEATURES
    return values


@pytest.mark.parametrize(
    ("answer", "cut"),
    [
        ("Photosynthesis turns light into sugar. It happens in the chloroplasts.", 0.0),
        ("Here is the code:\n```python\ndef f(x):\n    return x", 1.0),  # open fence
        ("| year | price |\n|---|---|\n| 1985 | 62.1", 1.0),  # a table row left open
        ("The result is computed as total = price *", 1.0),  # an expression left open
        ("Photosynthesis turns light into sugar, and the sugar then feeds the plant " * 4
         + "while the", 1.0),  # a long answer's last sentence has no end
        ("It is 42", 0.0),  # short: no verdict
    ],
)  # fmt: skip
def test_an_answer_cut_off_mid_way_is_flagged(answer: str, cut: float) -> None:
    assert features("Explain photosynthesis.", answer)["cut_off"] == cut


def test_explicit_constraints_are_counted_and_checked() -> None:
    prompt = "Describe the sea in 10 words. Start every sentence with Waves."  # slack: 17
    kept = features(prompt, "Waves roll in. Waves shine at dawn.")
    broken = features(prompt, "The sea is vast, blue and deep; it covers most of our planet " * 2)
    assert (kept["constraints_asked"], kept["constraints_broken"]) == (2.0, 0.0)
    assert (broken["constraints_asked"], broken["constraints_broken"]) == (2.0, 2.0)
    listed = "Give me 3 tips for sleeping well."
    assert features(listed, "- Dark room\n- No coffee\n- Same hour")["constraints_broken"] == 0
    assert features(listed, "- Dark room\n- No coffee")["constraints_broken"] == 1


def test_the_prompt_and_answer_signals() -> None:
    prompt = "Write a Python script that counts words in a file."
    with_code = features(prompt, "```python\nprint(len(open('f').read().split()))\n```")
    without = features(prompt, "Open the file, split it on whitespace and count the parts.")
    assert (with_code["code_asked_missing"], without["code_asked_missing"]) == (0.0, 1.0)
    assert with_code["prompt_code"] == 1.0
    refusal = features("Tell me a joke.", "I'm sorry, but I can't help with that.")
    assert refusal["short_refusal"] == 1.0
    on_topic = features("Explain photosynthesis in plants.", "Plants use photosynthesis: ...")
    off_topic = features("Explain photosynthesis in plants.", "Bananas are yellow.")
    assert on_topic["coverage"] > off_topic["coverage"] == 0.0
    assert features("Réponds en français.", "Sure, here it is.")["script_mismatch"] == 0.0
    assert features("日本語で答えてください。", "Sure, here it is.")["script_mismatch"] == 1.0


def test_the_signals_are_linear_on_hostile_input() -> None:
    hostile = ["|" * 200_000, "`" * 200_000, "a " * 200_000, "**" * 100_000 + "\n"]
    for text in hostile:
        start = time.perf_counter()
        open_features(text, text)
        assert time.perf_counter() - start < 1.0, text[:10]
