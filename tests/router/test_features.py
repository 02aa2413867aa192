from __future__ import annotations

import math

import numpy as np
import pytest

from router.features import (
    DENSE_NAMES,
    HASH_FEATURES,
    MAX_SCANNED_CHARS,
    extract,
    request_features,
)
from router.text import head_and_tail


def dense(messages: list[dict[str, object]], **fields: object) -> dict[str, float]:
    return dict(zip(DENSE_NAMES, extract(messages, **fields).dense.tolist(), strict=True))  # type: ignore[arg-type]


def user(text: str) -> list[dict[str, object]]:
    return [{"role": "user", "content": text}]


def test_code_is_detected() -> None:
    f = dense(user("Fix this:\n```python\ndef f(x):\n    return {x: 1};\n```\nWrite a function."))
    assert f["log_code_fences"] > 0
    assert f["log_code_keywords"] > 0
    assert f["log_code_asks"] > 0
    assert f["log_code_punctuation"] > 0


def test_maths_is_detected() -> None:
    f = dense(user(r"Solve $x^2 + 3 = 12$ and prove that \frac{a}{b} is rational. 4 * 5 = 20"))
    assert f["log_math_words"] > 0
    assert f["log_latex"] > 0
    assert f["log_math_expressions"] > 0
    assert f["digit_share"] > 0


def test_multiple_choice_is_detected() -> None:
    f = dense(user("Which is a mammal?\nA. shark\nB) whale\nC. trout\nD. eel\nAnswer:"))
    assert f["log_mc_options"] == math.log1p(4)
    assert f["log_answer_cues"] > 0
    assert f["log_question_marks"] > 0


def test_request_fields_and_conversation_shape() -> None:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": [{"type": "text", "text": "Explain why, step by step."}]},
        {"role": "assistant", "content": None},
        {"role": "user", "content": "Write a detailed essay."},
    ]
    f = dense(
        messages,
        tools=[{"type": "function"}, {"type": "function"}],
        response_format={"type": "json_object"},
        max_tokens=2000,
    )
    assert f["has_system"] == 1.0
    assert f["log_messages"] == math.log1p(4)
    assert f["log_user_turns"] == math.log1p(2)
    assert f["log_reasoning_words"] > 0
    assert f["log_long_output_words"] > 0
    assert (f["has_tools"], f["log_tools"], f["json_output"]) == (1.0, math.log1p(2), 1.0)
    assert f["log_max_tokens"] == math.log1p(2000)


def test_values_are_bounded_and_stable() -> None:
    huge = user("¿Qué? 数学 " * 5000 + "}" * 1000)
    vector = request_features(huge)
    assert vector.shape == (len(DENSE_NAMES) + HASH_FEATURES,)
    assert np.all(np.isfinite(vector))
    assert vector.min() >= 0.0 and vector.max() < 20.0
    assert np.isclose(np.linalg.norm(vector[len(DENSE_NAMES) :]), 1.0)
    assert np.array_equal(vector, request_features(huge))


def test_empty_request() -> None:
    vector = request_features([])
    assert np.all(vector == 0.0)


def test_question_block_is_the_last_one_of_a_few_shot_prompt() -> None:
    shot = "Q: 2 + 2?\nA) 3\nB) 4\nAnswer: B"
    question = "Which of the following is NOT a prime?\nA) 2\nB) 3\nC) 9\nD) 11 or 13\nAnswer:"
    f = dense(user("\n\n".join([shot, shot, question])))
    assert f["q_log_chars"] == math.log1p(len(question))
    assert f["q_log_blocks"] == math.log1p(3)
    assert f["q_log_context_chars"] == math.log1p(2 * len(shot) + 4)
    assert f["q_log_options"] == math.log1p(4)
    assert f["q_log_max_option"] == math.log1p(len("11 or 13"))
    assert f["q_log_stem"] == math.log1p(len("Which of the following is NOT a prime?\n"))
    assert f["q_log_negations"] == math.log1p(1)
    assert f["q_asks_question"] == 1.0


def test_question_block_is_read_from_the_last_user_turn() -> None:
    messages: list[dict[str, object]] = [
        {"role": "user", "content": "first question, long " * 20},
        {"role": "assistant", "content": "an answer"},
        {"role": "user", "content": "Why?"},
    ]
    f = dense(messages)
    assert f["q_log_chars"] == math.log1p(4)
    assert f["q_log_context_chars"] == 0.0


def test_a_long_conversation_is_read_at_its_head_and_tail_with_exact_lengths() -> None:
    """Content features read the first and last MAX_SCANNED_CHARS / 2 characters (a pasted
    document's start, and the end with the question); lengths count the whole."""
    half = MAX_SCANNED_CHARS // 2
    head = "Solve x^2 = 4. " * 300  # maths words, read
    middle = "```python\ndef f(): return 1\n``` " * 20_000  # code, only in the unread middle
    filler = "Some context here. " * 300  # the read tail's context
    question = "Which is right?\nA) 2\nB) 3\nAnswer:"
    text = f"{head}{middle}\n\n{filler}\n\n{question}"
    assert min(len(head), len(filler)) > half
    f = dense(user(text))
    assert f["log_chars"] == math.log1p(len(text))  # the whole length
    assert f["log_code_fences"] == 0.0  # the middle is not read
    assert f["log_math_words"] > 0  # the head is
    assert f["log_mc_options"] == math.log1p(2)  # and the question at the end
    # The question's context is everything before it, read or not.
    assert f["q_log_context_chars"] == math.log1p(len(text) - len(question))
    # Words are estimated at the density of the part read: near the real count.
    assert abs(f["log_words"] - math.log1p(len(text.split()))) < 0.5


def test_a_conversation_within_the_bound_is_read_whole() -> None:
    text = "word " * (MAX_SCANNED_CHARS // 5)
    assert head_and_tail(text, MAX_SCANNED_CHARS) is text
    assert dense(user(text))["log_words"] == math.log1p(len(text.split()))


@pytest.mark.parametrize("extra", [0, 1])
def test_the_bound_is_exact(extra: int) -> None:
    """At MAX_SCANNED_CHARS a conversation is read whole; one character more, it is cut."""
    text = "x" * (MAX_SCANNED_CHARS + extra)
    read = head_and_tail(text, MAX_SCANNED_CHARS)
    assert (read is text) == (extra == 0)
    assert len(read) <= MAX_SCANNED_CHARS + 1  # the two halves and a newline
    assert dense(user(text))["log_chars"] == math.log1p(len(text))
    assert head_and_tail("abc", 1) == "a\nc"  # a tiny bound still keeps both ends


def test_a_long_one_block_question_is_all_question() -> None:
    """A question longer than the part read, with no blank line in it: its length is the
    whole turn's and there is no context before it (as for a short one-block prompt)."""
    text = "Explain why the following holds in detail " * 1_000 + "?"
    f = dense(user(text))
    assert f["q_log_chars"] == math.log1p(len(text))
    assert f["q_log_context_chars"] == 0.0
    assert abs(f["q_log_words"] - math.log1p(len(text.split()))) < 0.1
