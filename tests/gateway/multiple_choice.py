"""A multiple-choice question, the kind a cascade route asks its second opinions on
(the answer is the letter B). Used by test_second_opinions and test_prompt_count_reuse."""

from __future__ import annotations

QUESTION = {
    "role": "user",
    "content": "A student heats water in a pot. Which change of state happens when the "
    "water boils?\n(A) solid to liquid\n(B) liquid to gas\n(C) gas to liquid\n"
    "(D) liquid to solid\nAnswer:",
}
