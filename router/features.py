"""Hand-made request features for the complexity classifier.

Two parts, both stateless (nothing fitted, so the same request always gives the same
vector in any process):

- dense: ~35 structural signals over the whole conversation (length, turns, code, maths,
  reasoning, multiple-choice shape, language, requested output length, tools, JSON
  output) and ~20 over the question being asked: the last blank-line-separated block of
  the last user message, so that a few-shot prompt's examples do not drown it (its
  length, stem and answer-option lengths, numbers, sentences, negations, "I and II"
  combinations); each bounded by a log or a share so no single request can dominate a
  linear model;
- hashed: word unigrams and bigrams hashed into `HASH_FEATURES` buckets with CRC-32
  (stable across processes, unlike `hash()`), L2-normalised counts.

    vector = request_features([{"role": "user", "content": "Prove that ..."}])

Bump `FEATURE_VERSION` whenever a feature changes meaning: saved models record it.
"""

from __future__ import annotations

import itertools
import math
import re
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from router.answers import prompt_kind
from router.text import head_and_tail

FEATURE_VERSION = 2
MAX_TOKENS_READ = 10**7  # a larger max_tokens reads as this (a 400-digit one overflows a float)
HASH_FEATURES = 2**12
# Content features read at most this much of a conversation: its head and its tail (the
# question is at the end); lengths stay exact. Every training prompt is shorter (under
# 5,000 characters), so no trained weight reads otherwise. Unbounded, a 2 MB body held
# the event loop for 1.6 s; at this bound a decision costs at most a few ms.
MAX_SCANNED_CHARS = 8_000
# Small talk: a conversation this short whose question is of no task kind (options,
# maths, code: `answers.prompt_kind`) and names no code, maths or reasoning work
# (`WORD_MARKERS`). No training prompt is one (the shortest has 42 characters; arena
# chat's short ones, "Write HEVC NAL parser in c++ ...", are hard), so it takes a prior.
SMALL_TALK_CHARS = 40
SMALL_TALK_MARKERS = ("code_keywords", "code_asks", "math_words", "reasoning_words")

Message = Mapping[str, Any]
FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


# Word markers, counted over the lower-cased tokens (`TOKEN`: runs of 2+ word
# characters, so "a" and "I" are dropped) as unigrams or bigrams of the conversation.
WORD_MARKERS: Mapping[str, tuple[str, ...]] = {
    "code_keywords": (
        "def",
        "class",
        "function",
        "import",
        "return",
        "const",
        "var",
        "void",
        "lambda",
        "elif",
        "println",
        "printf",
        "self",
        "null",
        "none",
        "int",
        "str",
        "array",
    ),
    "code_asks": (
        "write function",
        "write program",
        "write script",
        "python function",
        "implement",
        "algorithm",
        "debug",
        "refactor",
        "regex",
        "sql",
        "python",
        "javascript",
        "code",
    ),
    "math_words": (
        "solve",
        "calculate",
        "compute",
        "prove",
        "proof",
        "equation",
        "integral",
        "derivative",
        "probability",
        "theorem",
        "how many",
        "how much",
        "percent",
        "percentage",
        "average",
        "ratio",
        "matrix",
        "polynomial",
        "sum",
        "total",
    ),
    "reasoning_words": (
        "explain why",
        "by step",
        "compare",
        "contrast",
        "analyze",
        "analyse",
        "justify",
        "evaluate",
        "derive",
        "reason",
        "reasoning",
        "implications",
        "tradeoffs",
        "trade offs",
        "pros and",
        "critique",
        "why",
    ),
    "negations": ("not", "except", "least", "false", "incorrect", "never"),
    "long_output_words": (
        "essay",
        "detailed",
        "in detail",
        "comprehensive",
        "in depth",
        "thorough",
        "thoroughly",
        "elaborate",
        "report",
        "article",
        "story",
    ),
    "short_output_words": (
        "brief",
        "briefly",
        "short",
        "concise",
        "concisely",
        "one word",
        "single word",
        "single choice",
        "only",
        "tl dr",
        "yes or",
        "without explanation",
    ),
}
WORD_MARKER_INDEX: Mapping[str, int] = {
    word: i for i, words in enumerate(WORD_MARKERS.values()) for word in words
}

# Shape markers, counted with a regular expression over the raw text. An option line's
# indent is `[^\S\n]` (`\s` but a newline): the same lines match as with `^\s*`, which
# let every line start in a run of blank lines rescan the rest of the run (quadratic).
PATTERN_MARKERS: Mapping[str, re.Pattern[str]] = {
    "code_fences": re.compile(r"```"),
    "code_punctuation": re.compile(r"[{};]"),
    "math_expressions": re.compile(r"\d\s*[-+*/^=<>\u00d7\u00f7]\s*\(?\d"),
    "latex": re.compile(r"\\[a-zA-Z]{2,}|\$[^$\n]{1,200}\$"),
    "mc_options": re.compile(r"^[^\S\n]*+\(?[A-Ea-e][.)]\s", re.MULTILINE),
    "answer_cues": re.compile(r"Answer\s*:|ANSWER\s*:|answer\s*:"),
    "question_marks": re.compile(r"\?"),
}

# Shape of the question block (the last blank-line-separated block of the last user turn);
# option lines indented as in `PATTERN_MARKERS`.
QUESTION_PATTERNS: Mapping[str, re.Pattern[str]] = {
    "block": re.compile(r"\n\s*\n"),
    "option": re.compile(r"^[^\S\n]*+\(?[A-Ea-e][.)][ \t]*(.*)$", re.MULTILINE),
    "number": re.compile(r"\d+(?:[.,]\d+)?"),
    "word": re.compile(r"[A-Za-z]+"),
    "operator": re.compile(r"[-+*/^=<>%$]"),
    "negation": re.compile(r"\b(?:NOT|EXCEPT|LEAST|not|except|least|false|incorrect|never)\b"),
    "combination": re.compile(r"\b(?:I{1,3}|IV)\s*(?:only|and|,)"),
    "all_of": re.compile(r"(?:all|none|both) of the (?:above|following)|both [a-z]+ and", re.I),
    "sentence_end": re.compile(r"[.!?](?:\s|$)"),
    "blank": re.compile(r"\b_\b|_{2,}"),
    "capitalised": re.compile(r"\b[A-Z][a-z]+"),
}
QUESTION_NAMES = (
    "q_log_chars",
    "q_log_words",
    "q_log_context_chars",
    "q_log_blocks",
    "q_log_options",
    "q_log_mean_option",
    "q_log_max_option",
    "q_log_stem",
    "q_log_numbers",
    "q_digit_share",
    "q_mean_word_length",
    "q_long_word_share",
    "q_capitalised_share",
    "q_log_operators",
    "q_log_negations",
    "q_log_combinations",
    "q_log_all_of",
    "q_log_sentences",
    "q_asks_question",
    "q_has_blank",
    "q_option_spread",
    "q_distinct_word_share",
)

STRUCTURE_NAMES = (
    "log_chars",
    "log_words",
    "log_lines",
    "log_last_user_chars",
    "log_messages",
    "log_user_turns",
    "has_system",
    "log_system_chars",
    "mean_word_length",
    "digit_share",
    "non_ascii_share",
    "uppercase_share",
    "log_max_tokens",
    "has_max_tokens",
    "has_tools",
    "log_tools",
    "json_output",
)
DENSE_NAMES: tuple[str, ...] = (
    STRUCTURE_NAMES
    + tuple(f"log_{name}" for name in WORD_MARKERS)
    + tuple(f"log_{name}" for name in PATTERN_MARKERS)
    + QUESTION_NAMES
)

_MARKER_COLUMNS = {name: DENSE_NAMES.index(f"log_{name}") for name in WORD_MARKERS}

TOKEN = re.compile(r"\w\w+")
UPPERCASE = re.compile(r"[A-Z]")
DIGIT = re.compile(r"\d")
NON_ASCII = re.compile(r"[^\x00-\x7f]")
# Bigram bucket = mix of its two unigram hashes (no string building on the hot path).
BIGRAM_MIX = np.uint64(1_000_003)


@dataclass(frozen=True, slots=True)
class RequestFeatures:
    """One request's features: the dense part and the sparse hashed part."""

    dense: FloatArray
    hash_index: IntArray
    hash_value: FloatArray
    small_talk: bool = False  # `SMALL_TALK_CHARS`: "hi", "thanks", a one-line question

    def to_array(self) -> FloatArray:
        """Dense vector: `DENSE_NAMES` then the `HASH_FEATURES` hashed buckets."""
        vector = np.zeros(len(DENSE_NAMES) + HASH_FEATURES)
        vector[: len(DENSE_NAMES)] = self.dense
        vector[len(DENSE_NAMES) + self.hash_index] = self.hash_value
        return vector


def message_text(message: Message) -> str:
    """The text of a chat message: a string, or the text parts of a content list."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = (p.get("text") for p in content if isinstance(p, Mapping))
        return "\n".join(p for p in parts if isinstance(p, str))
    return ""


def extract(
    messages: Sequence[Message],
    *,
    tools: Sequence[object] | None = None,
    response_format: Mapping[str, Any] | None = None,
    max_tokens: int | None = None,
) -> RequestFeatures:
    """Features of a chat request (all messages, plus the request fields that matter)."""
    texts = [message_text(m) for m in messages]
    text = "\n".join(texts)
    scanned = head_and_tail(text, MAX_SCANNED_CHARS)
    tokens = TOKEN.findall(scanned.lower())
    dense = _structure(messages, texts, text, scanned, tools, response_format, max_tokens)
    dense += _word_markers(tokens)
    dense += [math.log1p(len(pattern.findall(scanned))) for pattern in PATTERN_MARKERS.values()]
    question = _last_user(messages, texts)
    dense += _question(question)
    index, value = _hashed(tokens)
    small_talk = _small_talk(text, dense, question)
    return RequestFeatures(np.array(dense), index, value, small_talk)


def _small_talk(text: str, dense: list[float], question: str) -> bool:
    if len(text.strip()) >= SMALL_TALK_CHARS:
        return False
    if any(dense[_MARKER_COLUMNS[name]] for name in SMALL_TALK_MARKERS):
        return False
    return prompt_kind(question) is None


def extract_body(request: Mapping[str, Any]) -> RequestFeatures:
    """`extract` of an OpenAI-style request body: `messages`, and the optional `tools`,
    `response_format` and `max_tokens`."""
    return extract(
        request["messages"],
        tools=request.get("tools"),
        response_format=request.get("response_format"),
        max_tokens=request.get("max_tokens"),
    )


def request_features(
    messages: Sequence[Message],
    *,
    tools: Sequence[object] | None = None,
    response_format: Mapping[str, Any] | None = None,
    max_tokens: int | None = None,
) -> FloatArray:
    """The full feature vector (`DENSE_NAMES`, then the hashed buckets) of a request."""
    features = extract(
        messages, tools=tools, response_format=response_format, max_tokens=max_tokens
    )
    return features.to_array()


def _structure(
    messages: Sequence[Message],
    texts: list[str],
    text: str,
    scanned: str,
    tools: Sequence[object] | None,
    response_format: Mapping[str, Any] | None,
    max_tokens: int | None,
) -> list[float]:
    """Lengths of the whole conversation; shares read from the part ``scanned``."""
    roles = [m.get("role") for m in messages]
    pairs = list(zip(texts, roles, strict=True))
    system = "\n".join(t for t, r in pairs if r in ("system", "developer"))
    last_user = _last_user(messages, texts)
    chars = max(len(scanned), 1)
    words = scanned.split()
    # Lengths (characters, words, lines) are the whole conversation's, counts of markers
    # the part read's: a long one's words, as many per character as in that part (all of
    # them when it is read whole: the ratio is then exactly 1).
    n_words = len(words) * len(text) / chars
    format_type = (response_format or {}).get("type")
    return [
        math.log1p(len(text)),
        math.log1p(n_words),
        math.log1p(text.count("\n")),
        math.log1p(len(last_user)),
        math.log1p(len(messages)),
        math.log1p(roles.count("user")),
        float(bool(system)),
        math.log1p(len(system)),
        min(sum(map(len, words)) / max(len(words), 1), 20.0) / 10.0,
        len(DIGIT.findall(scanned)) / chars,
        len(NON_ASCII.findall(scanned)) / chars,
        len(UPPERCASE.findall(scanned)) / chars,
        math.log1p(min(max(max_tokens or 0, 0), MAX_TOKENS_READ)),
        float(max_tokens is not None),
        float(bool(tools)),
        math.log1p(len(tools or ())),
        float(format_type in ("json_object", "json_schema")),
    ]


def _last_user(messages: Sequence[Message], texts: list[str]) -> str:
    pairs = zip(texts, (m.get("role") for m in messages), strict=True)
    return next((t for t, r in reversed(list(pairs)) if r == "user"), "")


def _question(text: str) -> list[float]:
    """Shape of the question asked: the last block of the last user turn, the blocks
    before it being few-shot examples or context (a one-block prompt is all question)."""
    p = QUESTION_PATTERNS
    whole = text.strip()
    tail = whole[-MAX_SCANNED_CHARS:]  # the question is at the end
    blocks = [b for b in p["block"].split(tail) if b.strip()]
    question = blocks[-1] if blocks else ""
    unread = len(whole) - len(tail)
    # The unread head is context before the question, unless the read tail is all one
    # block: then the question began before it (its length counts the whole turn).
    one_block = unread > 0 and len(blocks) == 1
    question_chars = len(whole) if one_block else len(question)
    context = (
        sum(map(len, blocks[:-1])) + 2 * max(len(blocks) - 1, 0) + (0 if one_block else unread)
    )
    options = [len(o) for o in p["option"].findall(question)]
    first_option = p["option"].search(question)
    stem = question[: first_option.start()] if first_option else question
    words = p["word"].findall(question)
    n_words, n_chars = max(len(words), 1), max(len(question), 1)
    log_options = [math.log1p(n) for n in options] or [0.0]
    # Lengths whole, as in _structure: a cut question's words at the density read.
    question_words = len(question.split()) * question_chars / max(len(question), 1)
    return [
        math.log1p(question_chars),
        math.log1p(question_words),
        math.log1p(context),
        math.log1p(len(blocks)),
        math.log1p(len(options)),
        math.log1p(sum(options) / len(options)) if options else 0.0,
        max(log_options),
        math.log1p(len(stem)),
        math.log1p(len(p["number"].findall(question))),
        len(DIGIT.findall(question)) / n_chars,
        min(sum(map(len, words)) / n_words, 20.0) / 10.0,
        sum(len(w) >= 10 for w in words) / n_words,
        len(p["capitalised"].findall(question)) / n_words,
        math.log1p(len(p["operator"].findall(question))),
        math.log1p(len(p["negation"].findall(question))),
        math.log1p(len(p["combination"].findall(question))),
        math.log1p(len(p["all_of"].findall(question))),
        math.log1p(len(p["sentence_end"].findall(stem))),
        float("?" in stem),
        float(p["blank"].search(question) is not None),
        max(log_options) - min(log_options),
        len({w.lower() for w in words}) / n_words,
    ]


def _word_markers(tokens: list[str]) -> list[float]:
    counts = [0] * len(WORD_MARKERS)
    lookup = WORD_MARKER_INDEX.get
    for gram in itertools.chain(tokens, map(" ".join, itertools.pairwise(tokens))):
        found = lookup(gram)
        if found is not None:
            counts[found] += 1
    return [math.log1p(c) for c in counts]


def _hashed(tokens: list[str]) -> tuple[IntArray, FloatArray]:
    if not tokens:
        return np.zeros(0, dtype=np.int64), np.zeros(0)
    unigrams = np.array([zlib.crc32(t.encode()) for t in tokens], dtype=np.uint64)
    bigrams = (unigrams[:-1] * BIGRAM_MIX) ^ unigrams[1:]
    buckets = np.concatenate([unigrams, bigrams]) % np.uint64(HASH_FEATURES)
    index, counts = np.unique(buckets.astype(np.int64), return_counts=True)
    value = counts.astype(np.float64)
    value /= math.sqrt(float(value @ value))
    return index, value
