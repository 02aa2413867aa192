"""What kind of answer a prompt asks for, and the final answer a response gives.

Two answers to the same multiple-choice or maths question can be compared by their
final answer (the option letter, the final number) whatever the words around it. The
cascade uses this as a second opinion: when another model (or another sample of the
same one) reaches the same final answer, the cheap answer is much more likely right;
when they differ, one of them is wrong. Code has no final answer, but right solutions
to one task look alike (``code_agreement``: token trigrams in common). Free text has
nothing to compare, so it gets no opinion (NaN) rather than a noisy one.

    open_ended(prompt)                              # no final answer to check: chat, writing
    final_answer(prompt, "The answer is (B).")      # "B" on a multiple-choice prompt
    agreement(prompt, answer, [other_answer])       # share of others agreeing, or NaN
    code_agreement(prompt, code, [other_code])      # how alike two answers' code is

Every pattern here runs on untrusted text inside the request path, so each is linear:
no two adjacent quantifiers can trade the same characters (possessive ``*+`` where
they could), and option lines are matched within one line (``[ \\t]``, not ``\\s``).
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Sequence
from typing import Literal

MC_OPTION = re.compile(r"^[ \t]*+\(?([A-E])[.):][ \t]++\S", re.MULTILINE)
_MC_ANSWER = re.compile(
    r"^\W*+\(?([A-E])\)?\**(?:[.):]|\s*+$)"  # "B", "(B)", "B.", "**B**"
    r"|(?i:answer(?: is)?)\s*+[:\-]?\s*+\**\(?([A-E])\b"  # "The answer is (B)", "ANSWER: C"
)
# A number as written: an optional sign (not a hyphen joining two numbers, "10-12"),
# an optional $, thousands in groups of three ("12,345"; a bounded run, so a long
# comma chain is not rescanned from every group) or plain digits, decimals (".5" too).
_NUMBER_TEXT = r"(?:(?<![\w.])-)?\$?(?:(?:\d{1,3}(?:,\d{3}){1,6}+(?!\d)|\d++)(?:\.\d++)?|\.\d++)"
# A value: a number, or a fraction of two ("1/2", and LaTeX's \frac{1}{2} rewritten so).
_VALUE_TEXT = rf"{_NUMBER_TEXT}(?:[ \t]*+/[ \t]*+\d++(?:\.\d++)?)?"
NUMBER = re.compile(_NUMBER_TEXT)
_VALUE = re.compile(_VALUE_TEXT)
_LATEX_FRACTION = re.compile(r"\\d?frac\{(-?\d++(?:\.\d++)?)\}\{(\d++(?:\.\d++)?)\}")
_MATH_PROMPT = re.compile(
    r"\b(how many|how much|how long|how far|how old|what is the (?:total|sum|value|"
    r"product|difference)|calculate|compute|solve|percent|per cent)\b|[=+*/^][ \t]*+\d"
    # Arithmetic in words: "6 times 7", "12 divided by 4", "9 squared".
    r"|\d[ \t]*+(?:times|plus|minus|multiplied by|divided by|to the power of)[ \t]++-?\d"
    r"|\d[ \t]*+(?:squared|cubed)\b|answer with (?:a|one|just a) number",
    re.IGNORECASE,
)
# Where an answer states its result: GSM8K's "#### 42", LaTeX's \boxed{42}, "answer is
# 42" (a hyphen there is a dash unless a digit follows). A marked value that starts an
# expression ("the answer is 2^10 = 1024") is no result (atomic: not "2.5^2" read as
# "2"); the last value is taken instead.
_MARKED_VALUE = re.compile(
    rf"(?:####|\\boxed\{{|answer(?: is)?\s*+(?::|-(?![\d$.]))?\s*+)((?>{_VALUE_TEXT}))"
    r"(?![ \t]*+[\^*+\u00d7])",  # ^, *, +, the multiplication sign
    re.IGNORECASE,
)
# Asks for code. An explicit request ("write a function ...") is code even when it names
# a quantity ("... to compute the area"); the looser cues (a fence, "python", "fix the
# code") only when the prompt is no maths question ("a python eats 3 mice a day").
_EXPLICIT_CODE_PROMPT = re.compile(
    r"\b(?:write|implement)\b[^.?!\n]{0,30}?\b(?:function|program|script|method)\b"
    r"|\bpython (?:function|program|script|code)\b",
    re.IGNORECASE,
)
_CODE_PROMPT = re.compile(
    r"\b(write|implement|create|complete|fix)\b.{0,40}\b(function|program|script|class|"
    r"method|code)\b|\bpython\b|```",
    re.IGNORECASE | re.DOTALL,
)
# Code in an answer without fences (prose compared as code would only look unlike).
_CODE_SIGN = re.compile(r"\bdef \w++\(|\breturn\b|^[ \t]*+(?:import|from) \w", re.MULTILINE)
_CODE_TOKEN = re.compile(r"[A-Za-z_]\w*+|\d++|[^\s\w]")
_PYTHON_TAGS = re.compile(r"\[/?PYTHON\]")  # Code Llama's fences
FENCE = re.compile(r"```[ \t]*+([\w+#.-]*+)")  # a fence, and the language it names
MAX_CODE_CHARS = 8000  # code is compared on the head of long answers
# Two code answers "agree" (for the metric and header) from this similarity: about the
# median between two right answers to one task in the shipped MBPP data (0.09 when one
# of them is wrong). The verifier takes the similarity itself.
CODE_AGREES = 0.15
MAX_SCANNED_CHARS = 8000  # final answers are looked for in the head of long answers
MAX_QUESTION_CHARS = 8000  # a prompt's kind is read from its end, where the question is
# A closed-form request is one short paragraph of plain prose (a word problem, "write a
# function to ..."): no line breaks, code or markup, at most this long.
MAX_CLOSED_CHARS = 1000
MAX_FUNCTION_REQUEST_CHARS = 600
# A number, as digits or a word: a word problem states its quantities.
_QUANTITY = re.compile(
    r"\d|\b(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|"
    r"twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|thousand|million|half|"
    r"third|quarter|fourth|fifth|dozen|twice|thrice|double|triple)\b",
    re.IGNORECASE,
)
# ... and asks for one ("how many", "calculate", "what is the total").
_QUANTITY_ASKED = re.compile(
    r"\b(?:how (?:many|much|old|long|far|fast|tall|big|high|large|often|"
    r"\w++ (?:does|do|did|is|are|was|were|can|could|will|would))|calculate|compute|find|"
    r"determine|what(?:'s| is| was| are| were| will| would| number| percent| place)|total|"
    r"average|percent(?:age)?|solve)\b",
    re.IGNORECASE,
)
# A request to produce something open-ended ("Write a story with 3 characters: how many
# ...") is no word problem, whatever numbers it states.
_PRODUCTION = re.compile(
    r"^\W*+(?:please |can you |could you )?(?:write|create|generate|explain|describe|design|"
    r"build|make|give|draft|compose|act|you are|imagine|suggest|list|summari[sz]e|implement|"
    r"code|help|tell)\b",
    re.IGNORECASE,
)
_FUNCTION_WORD = re.compile(r"\bfunctions?\b", re.IGNORECASE)

PromptKind = Literal["mc", "math", "code"] | None


def prompt_kind(prompt: str) -> PromptKind:
    """The kind of question: "mc" (lettered options and an "answer" cue), "code" (asks
    for a function, a program, Python), "math" (numbers and a question for a quantity)
    or None, read from the prompt's last
    ``MAX_QUESTION_CHARS`` (the question: long context before it costs nothing)."""
    return _question_kind(prompt[-MAX_QUESTION_CHARS:])


# Kept for the last few questions: one request's verifier, agreement and second opinions
# each ask the kind of the same question (a maths answer with two opinions: 12 times).
# Keyed on the question's end only, so a long prompt is neither kept nor hashed whole.
@functools.lru_cache(maxsize=16)
def _question_kind(question: str) -> PromptKind:
    if MC_OPTION.search(question) and "answer" in question.lower():
        return "mc"
    if _EXPLICIT_CODE_PROMPT.search(question):
        return "code"
    if _MATH_PROMPT.search(question) and any(c.isdigit() for c in question):
        return "math"
    if _CODE_PROMPT.search(question):
        return "code"
    return None


def open_ended(prompt: str) -> bool:
    """Whether ``prompt`` asks for an open-ended answer (chat, writing, explanations,
    code help), which no final answer or test can check, rather than a closed-form one:
    lettered options, a word problem (one plain paragraph that states quantities and
    asks for one) or a short request for a function. Read from the prompt's end."""
    question = prompt[-MAX_QUESTION_CHARS:]
    kind = _question_kind(question)
    if kind == "mc":
        return False
    text = question.strip()
    one_paragraph = len(text) <= MAX_CLOSED_CHARS and "\n" not in text
    if kind == "code":
        return not (
            one_paragraph
            and len(text) <= MAX_FUNCTION_REQUEST_CHARS
            and _FUNCTION_WORD.search(text)
        )
    return not (
        one_paragraph
        and "`" not in text
        and not _PRODUCTION.match(text)
        and _QUANTITY.search(text)
        and _QUANTITY_ASKED.search(text)
    )


def comparable(prompt: str) -> bool:
    """Whether two answers to ``prompt`` can be compared (``agrees``): multiple choice,
    maths and code; free text cannot. Second opinions are asked only then."""
    return prompt_kind(prompt) is not None


def chosen_options(answer: str) -> set[str]:
    """The option letters an answer names (one when it commits to an option)."""
    return {(a or b).upper() for a, b in _MC_ANSWER.findall(answer[:400])}


def final_answer(prompt: str, answer: str) -> str | None:
    """The comparable final answer: the option letter on a multiple-choice prompt, the
    final number on a maths one (``final_number``, written canonically); None when there
    is none (free text, no commitment)."""
    kind = prompt_kind(prompt)
    if kind == "mc":
        options = chosen_options(answer)
        return options.pop() if len(options) == 1 else None
    if kind == "math":
        value = final_number(answer)
        if value is None:
            return None
        return str(int(value)) if value.is_integer() else repr(value)
    return None


def final_number(answer: str) -> float | None:
    """The value an answer ends on: the last one it marks as the answer ("####",
    \\boxed, "answer is"), else its last value; None when it has none or it overflows."""
    head = _LATEX_FRACTION.sub(r"\1/\2", answer[:MAX_SCANNED_CHARS])
    values = _MARKED_VALUE.findall(head) or _VALUE.findall(head)
    if not values:
        return None
    value = parse_value(values[-1])
    return value if value is not None and math.isfinite(value) else None


def parse_number(text: str) -> float:
    """A number as ``NUMBER`` matches it ("$1,250.00" -> 1250.0)."""
    return float(text.replace("$", "").replace(",", ""))


def parse_value(text: str) -> float | None:
    """A value as ``_VALUE`` matches it: a number or a fraction ("3/4" -> 0.75); None
    for a fraction over zero."""
    numerator, _, denominator = text.partition("/")
    if not denominator:
        return parse_number(numerator)
    below = float(denominator)
    return parse_number(numerator.strip()) / below if below else None


def agreement(prompt: str, answer: str, samples: Sequence[str]) -> float:
    """The share of ``samples`` (other answers to ``prompt``) whose final answer equals
    ``answer``'s; NaN when either side has none to compare (no opinion, not a vote
    against: a second opinion that rambled says nothing about the first)."""
    if not samples:
        return math.nan
    mine = final_answer(prompt, answer)
    if mine is None:
        return math.nan
    theirs = [final_answer(prompt, sample) for sample in samples]
    votes = [other == mine for other in theirs if other is not None]
    return sum(votes) / len(votes) if votes else math.nan


def agrees(prompt: str, answer: str, other: str) -> bool | None:
    """Whether another answer to ``prompt`` agrees with ``answer``: the same final answer,
    or code at least ``CODE_AGREES`` alike; None when there is nothing to compare."""
    if prompt_kind(prompt) == "code":
        similarity = code_agreement(prompt, answer, [other])
        return None if math.isnan(similarity) else similarity >= CODE_AGREES
    mine, theirs = final_answer(prompt, answer), final_answer(prompt, other)
    return None if mine is None or theirs is None else mine == theirs


def code_agreement(prompt: str, answer: str, samples: Sequence[str]) -> float:
    """How alike ``answer``'s code is to the samples' (mean Jaccard similarity of token
    trigrams): right solutions to one task converge, wrong ones wander. NaN when the
    prompt asks for no code or either side has none."""
    if not samples or prompt_kind(prompt) != "code":
        return math.nan
    mine = _code_trigrams(answer)
    if not mine:
        return math.nan
    theirs = [t for t in (_code_trigrams(s) for s in samples) if t]
    if not theirs:
        return math.nan
    return sum(len(mine & t) / len(mine | t) for t in theirs) / len(theirs)


def code_text(answer: str) -> str:
    """An answer's code: its fenced blocks (Code Llama's ``[PYTHON]`` tags too), else the
    whole text if it looks like code; "" for prose."""
    text = FENCE.sub("```", _PYTHON_TAGS.sub("```", answer[:MAX_CODE_CHARS]))
    parts = text.split("```")
    if len(parts) > 1:
        return "\n".join(parts[1::2])
    return text if _CODE_SIGN.search(text) else ""


def _code_trigrams(answer: str) -> set[tuple[str, ...]]:
    """The token trigrams of an answer's code; none for prose (nothing to compare)."""
    tokens = _CODE_TOKEN.findall(code_text(answer))
    return set(zip(tokens, tokens[1:], tokens[2:], strict=False))
