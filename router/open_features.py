"""Signals of an open-ended answer (chat, writing, explanations, code help) given its
prompt, with no reference answer: what the prompt asks (its length, code, a puzzle, a
role to play, explicit constraints) and whether the answer does it (covers the prompt's
words, has code when code was asked, keeps the word limits, counts and openings asked
for, answers in the prompt's script), besides its form (length, structure).

The closed-form signals (``router.verifier.extract_features``: truncation, refusals,
repetition, requested JSON, logprobs) are computed there; this module adds the rest.
Every scan is linear and bounded (``MAX_SCANNED_CHARS``): the text is untrusted.

    features = open_features(question, answer)
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Collection
from dataclasses import dataclass

from router.answers import prompt_kind

MAX_SCANNED_CHARS = 8000  # an answer's structure and words are read in its head
MAX_PROMPT_WORDS = 80  # coverage looks for the first this many distinct content words
SHORT_ANSWER_WORDS = 25
SHORT_REFUSAL_WORDS = 60  # a refusal longer than this usually goes on to help
LONG_ANSWER_CHARS = 200  # from this length an answer ending without punctuation was cut

_TERMINAL = frozenset(".!?)]}\"'`*:;>")
_CONTINUED = frozenset(",([{=+-*/\\&|")  # a line ending in these goes on
_WORD = re.compile(r"[^\W\d_]{2,}+")
_CONTENT_WORD = re.compile(r"[^\W\d_]{4,}+")
# From the start of a run of marks only: from each of them, a long run ("....a") was
# rescanned to its end (quadratic); no match starts inside a run, so the count is the same.
_SENTENCE_END = re.compile(r"(?<![.!?])[.!?]++(?:\s|$)")
_LIST_ITEM = re.compile(r"^[ \t]*+(?:[-*+\u2022]|\d{1,3}[.)])[ \t]++\S", re.MULTILINE)
_HEADING = re.compile(r"^[ \t]*+(?:#{1,6}[ \t]|\*\*[^*\n]{1,80}\*\*:?[ \t]*+$)", re.MULTILINE)
_TABLE_ROW = re.compile(r"^[ \t]*+\|.*\|[ \t]*+$", re.MULTILINE)
_APOLOGY = re.compile(r"\b(?:i apologi[sz]e|i'?m sorry|i am sorry|my apologies)\b")
_REFUSAL = re.compile(
    r"^\W*+(?:i'?m sorry|i am sorry|sorry,|i apologi[sz]e|as an ai\b|unfortunately,? i\b|"
    r"i (?:cannot|can'?t|can not|won'?t|will not|am unable|am not able)\b|"
    r"i'?m (?:unable|not able)\b|i (?:do not|don'?t) (?:have|feel|think i)\b)"
)
_CODE_IN_TEXT = re.compile(
    r"```|^[ \t]*+(?:def|class|import|from|function|const|let|var|public|#include)\b"
    r"|[;{}][ \t]*+$",
    re.MULTILINE,
)
_CODE_ASKED = re.compile(
    r"\b(?:code|script|program|function|implement\w*|snippet|class|regex|sql query|"
    r"dockerfile|shader)\b",
    re.IGNORECASE,
)
_PUZZLE = re.compile(
    r"\b(?:riddle|puzzle|trick|brain ?teaser|paradox|logic(?:al)?|lateral|prove|proof)\b",
    re.IGNORECASE,
)
_ROLEPLAY = re.compile(
    r"\b(?:act as|acting as|you are (?:a|an|now)|pretend|role ?play|imagine you|your role)\b",
    re.IGNORECASE,
)
_CREATIVE = re.compile(
    r"\b(?:poem|story|stories|script|screenplay|song|lyrics|essay|joke|haiku|limerick|"
    r"sonnet|rap|novel|fiction|dialogue)\b",
    re.IGNORECASE,
)
_STOPWORDS = frozenset((
    "that", "this", "with", "from", "have", "what", "which", "when", "where", "there",
    "their", "them", "they", "then", "than", "your", "about", "would", "could", "should",
    "will", "been", "were", "into", "each", "more", "most", "some", "such", "only", "also",
    "very", "just", "like", "make", "made", "want", "need", "please", "write", "give",
    "tell", "explain", "using", "following", "below", "above", "these", "those", "does",
    "doing", "done", "here", "other", "over", "under", "while",
))  # fmt: skip
# Explicit constraints a prompt states (``_constraint_checks``).
_NUMBERS = {
    "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
    "eight": 8, "nine": 9, "ten": 10, "twelve": 12, "fifteen": 15, "twenty": 20,
}  # fmt: skip
_COUNT = r"(\d{1,4}|" + "|".join(_NUMBERS) + r")"
_WORD_LIMIT = re.compile(
    r"\b(?:in|under|within|at most|no more than|less than|fewer than|maximum(?: of)?|max)"
    rf"\s++{_COUNT}\s++words?\b",
    re.IGNORECASE,
)
_WORD_MINIMUM = re.compile(
    rf"\b(?:at least|more than|minimum(?: of)?)\s++{_COUNT}\s++words\b", re.I
)
_SENTENCE_COUNT = re.compile(rf"\b(?:in|with|using|exactly)\s++{_COUNT}\s++sentences?\b", re.I)
_ITEM_COUNT = re.compile(
    rf"\b(?:list|give|provide|suggest|name|recommend|write|generate|create|top)\s++(?:me\s++)?"
    rf"(?:the\s++)?(?:exactly\s++)?{_COUNT}\s++(?:\w+\s++)?"
    r"(?:ideas|ways|tips|reasons|examples|items|points|steps|bullet points|questions|names|"
    r"options|things|words|facts|rules|movies|books|titles|sentences|jokes|suggestions)\b",
    re.IGNORECASE,
)
_SENTENCE_OPENING = re.compile(
    r"\b(?:start|begin)s?\s++(?:every|each|all)\s++(?:sentence|line|word|paragraph)s?\s++"
    r"with\s++(?:the\s++)?(?:letter\s++|word\s++)?[\"'\u201c]?([A-Za-z]+)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class _Reading:
    """What every group of signals reads: the answer's head and words, the prompt's words."""

    question: str
    answer: str
    head: str
    lowered: str
    words: int
    prompt_words: int

    @classmethod
    def of(cls, question: str, answer: str) -> _Reading:
        head = answer.strip()[:MAX_SCANNED_CHARS]
        lowered = head.lower().replace("\u2019", "'")
        prompt_words = len(_WORD.findall(question[:MAX_SCANNED_CHARS].lower()))
        return cls(question, answer, head, lowered, len(_WORD.findall(lowered)), prompt_words)


def open_features(
    question: str, answer: str, names: Collection[str] | None = None
) -> dict[str, float]:
    """The open-ended signals of ``answer`` to ``question`` (the user's turns), keyed by
    ``OPEN_FEATURES``; with ``names``, only the groups of signals that compute them (a
    model's own: the request path reads no more than it weighs)."""
    reading = _Reading.of(question, answer)
    features: dict[str, float] = {}
    for group, compute in _GROUPS:
        if names is None or not set(group).isdisjoint(names):
            features.update(compute(reading))
    return features


def _shape_features(r: _Reading) -> dict[str, float]:
    return {
        "cut_off": float(_cut_off(r.answer[-MAX_SCANNED_CHARS:])),
        "very_short_answer": float(r.words < SHORT_ANSWER_WORDS),
        "short_refusal": float(bool(_REFUSAL.match(r.lowered)) and r.words < SHORT_REFUSAL_WORDS),
        "length_ratio": math.log((r.words + 1) / (r.prompt_words + 1)),
        "log_prompt_words": math.log1p(r.prompt_words),
    }


def _structure_features(r: _Reading) -> dict[str, float]:
    head = r.head
    return {
        "apology": float(bool(_APOLOGY.search(r.lowered[:400]))),
        "list_items": math.log1p(len(_LIST_ITEM.findall(head))),
        "headings": math.log1p(len(_HEADING.findall(head))),
        "code_blocks": math.log1p(head.count("```") // 2),
        "table_rows": math.log1p(len(_TABLE_ROW.findall(head))),
        "paragraphs": math.log1p(sum(1 for block in head.split("\n\n") if block.strip())),
    }


def _cut_off(answer: str) -> bool:
    """An answer that stops mid-way (a token limit): an open code fence, a table row or
    an expression left open, or a long answer whose last sentence has no end."""
    text = answer.rstrip()
    if not text:
        return False
    last = text[text.rfind("\n") + 1 :].strip()
    return (
        text.count("```") % 2 == 1
        or (last.startswith("|") and not last.endswith("|"))
        or last[-1] in _CONTINUED
        or (len(text) > LONG_ANSWER_CHARS and last[-1] not in _TERMINAL and not last[-1].isdigit())
    )


def _prompt_features(r: _Reading) -> dict[str, float]:
    text = r.question[-MAX_SCANNED_CHARS:]
    kind = prompt_kind(r.question)
    return {
        "prompt_code": float(kind == "code" or bool(_CODE_ASKED.search(text))),
        "prompt_has_code": float(len(_CODE_IN_TEXT.findall(text)) >= 2),
        "prompt_math": float(kind == "math"),
        "prompt_puzzle": float(bool(_PUZZLE.search(text))),
        "prompt_roleplay": float(bool(_ROLEPLAY.search(text))),
        "prompt_creative": float(bool(_CREATIVE.search(text))),
        "prompt_questions": math.log1p(text.count("?")),
    }


def _coverage(r: _Reading) -> dict[str, float]:
    """The share of the prompt's first distinct content words the answer uses: an
    answer on another subject, or one that ignores half the request, uses few."""
    answer_words = set(_WORD.findall(r.lowered))
    wanted: list[str] = []
    for word in _CONTENT_WORD.findall(r.question[:MAX_SCANNED_CHARS].lower()):
        if word not in _STOPWORDS and word not in wanted:
            wanted.append(word)
            if len(wanted) == MAX_PROMPT_WORDS:
                break
    used = sum(word in answer_words for word in wanted) / len(wanted) if wanted else 1.0
    return {"coverage": used}


def _code_features(r: _Reading) -> dict[str, float]:
    question = r.question
    asked = prompt_kind(question) == "code" or bool(_CODE_ASKED.search(question[-2000:]))
    present = bool(_CODE_IN_TEXT.search(r.head))
    in_prompt = len(_CODE_IN_TEXT.findall(question[-MAX_SCANNED_CHARS:])) >= 2
    return {
        "code_asked_missing": float(asked and not present),
        "code_unasked": float("```" in r.head and not asked and not in_prompt),
    }


def _constraint_features(r: _Reading) -> dict[str, float]:
    checks = _constraint_checks(r.question[-MAX_SCANNED_CHARS:], r.head, r.words)
    return {"constraints_asked": float(len(checks)), "constraints_broken": float(sum(checks))}


def _script_features(r: _Reading) -> dict[str, float]:
    mismatch = _non_ascii_share(r.question) - _non_ascii_share(r.head) > 0.3
    return {"script_mismatch": float(mismatch)}


def _constraint_checks(question: str, head: str, words: int) -> list[bool]:
    """One entry per explicit constraint the prompt states: True where the answer
    breaks it (with slack: a limit of 100 words allows 120)."""
    broken = []
    if match := _WORD_LIMIT.search(question):
        broken.append(words > 1.2 * _count(match.group(1)) + 5)
    if match := _WORD_MINIMUM.search(question):
        broken.append(words < 0.8 * _count(match.group(1)))
    if match := _SENTENCE_COUNT.search(question):
        sentences = len(_SENTENCE_END.findall(head)) or 1
        broken.append(abs(sentences - _count(match.group(1))) > 1)
    if match := _ITEM_COUNT.search(question):
        items = len(_LIST_ITEM.findall(head))
        broken.append(items > 0 and items != _count(match.group(1)))
    if match := _SENTENCE_OPENING.search(question):
        broken.append(not _openings_hold(head, match.group(1).lower()))
    return broken


def _count(text: str) -> int:
    return _NUMBERS.get(text.lower()) or int(text)


def _openings_hold(head: str, opening: str) -> bool:
    """Whether most sentences (or lines) start with ``opening`` (a word or a letter)."""
    parts = [p.strip(" \t*-\"'#>") for p in re.split(r"(?<=[.!?])\s+|\n+", head)]
    parts = [p.lower() for p in parts if len(p) > 1]
    if not parts:
        return False
    held: int = sum(p.startswith(opening) for p in parts)
    return held >= 0.8 * len(parts)


def _non_ascii_share(text: str) -> float:
    """The share of letters outside ASCII in the first 2,000 characters: another script."""
    letters = [c for c in text[:2000] if c.isalpha()]
    return sum(not c.isascii() for c in letters) / len(letters) if letters else 0.0


# The signals by group, each computed by one function (``open_features`` runs a group
# only when a signal of it is asked for); the order is ``OPEN_FEATURES``'.
_GROUPS: tuple[tuple[tuple[str, ...], Callable[[_Reading], dict[str, float]]], ...] = (
    (
        ("cut_off", "very_short_answer", "short_refusal", "length_ratio", "log_prompt_words"),
        _shape_features,
    ),
    (
        ("apology", "list_items", "headings", "code_blocks", "table_rows", "paragraphs"),
        _structure_features,
    ),
    (
        (
            "prompt_code",
            "prompt_has_code",
            "prompt_math",
            "prompt_puzzle",
            "prompt_roleplay",
            "prompt_creative",
            "prompt_questions",
        ),
        _prompt_features,
    ),
    (("coverage",), _coverage),
    (("code_asked_missing", "code_unasked"), _code_features),
    (("constraints_asked", "constraints_broken"), _constraint_features),
    (("script_mismatch",), _script_features),
)
OPEN_FEATURES: tuple[str, ...] = tuple(name for group, _ in _GROUPS for name in group)
