"""What kind of answer a prompt asks for, and the final answer a response gives.

Two answers to the same multiple-choice or maths question can be compared by their
final answer (the option letter, the final number) whatever the words around it. The
cascade uses this as a second opinion: when another model (or another sample of the
same one) reaches the same final answer, the cheap answer is much more likely right;
when they differ, one of them is wrong. Free text and code have no final answer to
compare, so they get no opinion (NaN) rather than a noisy one.

    final_answer(prompt, "The answer is (B).")      # "B" on a multiple-choice prompt
    agreement(prompt, answer, [other_answer])       # share of others agreeing, or NaN
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

MC_OPTION = re.compile(r"^\s*\(?([A-E])[.):]\s+\S", re.MULTILINE)
_MC_ANSWER = re.compile(
    r"^\W*\(?([A-E])\)?(?:[.):]|\s*$)|(?i:answer)(?: is)?\s*[:\-]?\s*\(?([A-E])\b"
)
NUMBER = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")
_MATH_PROMPT = re.compile(
    r"\b(how many|how much|how long|how far|how old|what is the (?:total|sum|value|"
    r"product|difference)|calculate|compute|solve|percent|per cent)\b|[=+*/^]\s*\d",
    re.IGNORECASE,
)
# Where an answer states its result: GSM8K's "#### 42", LaTeX's \boxed{42}, "answer is 42".
_MARKED_NUMBER = re.compile(
    r"(?:####|\\boxed\{|answer(?: is)?\s*[:\-]?)\s*(-?\$?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE
)
MAX_SCANNED_CHARS = 8000  # final answers are looked for in the head of long answers


def is_mc_prompt(prompt: str) -> bool:
    """Lettered options and an "answer" cue: a multiple-choice question."""
    return bool(MC_OPTION.search(prompt)) and "answer" in prompt.lower()


def is_math_prompt(prompt: str) -> bool:
    """A question with numbers that asks for a quantity (not multiple choice)."""
    return (
        not is_mc_prompt(prompt)
        and bool(_MATH_PROMPT.search(prompt))
        and any(c.isdigit() for c in prompt)
    )


def chosen_options(answer: str) -> set[str]:
    """The option letters an answer names (one when it commits to an option)."""
    return {(a or b).upper() for a, b in _MC_ANSWER.findall(answer[:400])}


def final_answer(prompt: str, answer: str) -> str | None:
    """The comparable final answer: the option letter on a multiple-choice prompt, the
    final number on a maths one; None when there is none (free text, no commitment)."""
    if is_mc_prompt(prompt):
        options = chosen_options(answer)
        return options.pop() if len(options) == 1 else None
    if is_math_prompt(prompt):
        return _final_number(answer[:MAX_SCANNED_CHARS])
    return None


def _final_number(answer: str) -> str | None:
    marked = _MARKED_NUMBER.findall(answer)
    numbers = marked or NUMBER.findall(answer)
    if not numbers:
        return None
    try:
        value = float(numbers[-1].replace("$", "").replace(",", ""))
    except ValueError:
        return None
    return f"{value:.6g}"


def agreement(prompt: str, answer: str, samples: Sequence[str]) -> float:
    """The share of ``samples`` (other answers to ``prompt``) whose final answer equals
    ``answer``'s; NaN when either side has none to compare (no opinion, not a vote
    against: a second opinion that rambled says nothing about the first)."""
    mine = final_answer(prompt, answer)
    if mine is None:
        return math.nan
    theirs = [final_answer(prompt, sample) for sample in samples]
    votes = [other == mine for other in theirs if other is not None]
    return sum(votes) / len(votes) if votes else math.nan
