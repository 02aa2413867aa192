"""Cascade verifier: how likely a cheap model's answer is acceptable.

The score is a logistic model over cheap text signals (``router.verifier_features``),
followed by hard caps for answers that are unusable whatever the model says (empty or
punctuation alone, invalid requested JSON). That judges closed-form answers (an
option letter, a word problem's number, a function); an open-ended prompt
(``router.open_verifier.judges``: chat, writing, code help) is judged by the model of
``router.open_verifier`` instead.
The weights live in ``router/models/verifier.json`` (built by ``router.training.verifier_train``);
scoring needs only the standard library.

Usage::

    verifier = Verifier.load()
    verifier.score("What is 2 + 3?", "2 + 3 = 5", finish_reason="stop")

Errors raised here are ``RoutingError`` (a missing or malformed artifact).
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from router import code_examples, verifier_code
from router.answers import prompt_kind
from router.artifacts import read_artifact
from router.code_examples import CodeJob, ExampleRun
from router.errors import RoutingError
from router.open_features import OPEN_FEATURES
from router.open_verifier import OpenVerifier, judges
from router.text import head_and_tail
from router.verifier_code_features import named_languages, other_fenced
from router.verifier_features import FEATURE_NAMES, MAX_PROMPT_CHARS, Signals, extract_features

DEFAULT_PATH = Path(__file__).resolve().parent / "models" / "verifier.json"
# /2 adds the open-ended model (the "open_ended" section) to /1's closed-form one; a /1
# artifact still loads, and judges every answer as closed-form.
ARTIFACT_FORMAT = "cascade-verifier/2"
CLOSED_FORM_FORMAT = "cascade-verifier/1"

# Hard rules: when the feature is set, the score is at most this value.
SCORE_CAPS: dict[str, float] = {
    "empty": 0.01,
    "json_invalid": 0.05,
    "json_schema_mismatch": 0.1,
    "refusal": 0.2,
    "finish_length": 0.3,
    "math_no_number": 0.3,
    "degenerate_loop": 0.3,
    "code_stub": 0.2,
}
# Hard rules on maths questions only (`math_prompt`): a wrong arithmetic step. On the
# shipped GSM8K answers 14% of those with one are right (75% of all); in code answers
# the step check misreads assignments (56% right, as the rest), so there it only weighs.
MATH_SCORE_CAPS: dict[str, float] = {"math_wrong_step": 0.3}
# A hard rule on either model's score (closed-form and open-ended): an answer of
# punctuation alone (".", "...", "-", "?!") says nothing, so it is capped as an empty one,
# unless the question offers it (on an option line, or quoted). Symbols (<, +, €, an
# emoji) and every script's letters and digits are answers. Of the shipped data's 28,411
# answers (ARC, Winogrande, MBPP, GSM8K, arena chat) only an empty one is such.
NO_TEXT_CAP = SCORE_CAPS["empty"]


def says_nothing(question: str, response: str) -> bool:
    """Whether ``response`` is punctuation and whitespace only, not offered by
    ``question``."""
    answer = response.strip()
    if any(not c.isspace() and unicodedata.category(c)[0] not in "PZ" for c in answer):
        return False
    if not answer or answer not in question:
        return True
    if any(f"{quote}{answer}{quote}" in question for quote in ('"', "'", "`")):
        return False
    return all(_option(line) != answer for line in question.splitlines())


def _option(line: str) -> str | None:
    """The option a line offers, as "B) <" or "2. <" does (`<`); None for other lines."""
    line = line.strip()
    if len(line) > 2 and line[0].isalnum() and line[1] in ").:":
        return line[2:].strip()
    return None


def asks_for_python(prompt: str, question: str | None = None) -> bool:
    """A question that asks for code, no other language named (in Python, then); read
    at its head and tail, as ``extract_features`` reads it."""
    prompt = head_and_tail(prompt, MAX_PROMPT_CHARS)
    question = head_and_tail(question, MAX_PROMPT_CHARS) if question else prompt
    return prompt_kind(question) == "code" and not named_languages(prompt)


def code_job(prompt: str, response: str, question: str | None = None) -> CodeJob | None:
    """What to run to check ``response``'s code (``router.sandbox.run_examples``): the
    tests the question states, then the examples the answer claims, on a question that
    asks for code in Python; None otherwise."""
    if other_fenced(response) or not asks_for_python(prompt, question):
        return None
    tests = verifier_code.stated_tests(head_and_tail(question or prompt, MAX_PROMPT_CHARS))
    return code_examples.code_job(response, tests)


@dataclass(frozen=True)
class Verifier:
    """A logistic model over ``FEATURE_NAMES`` plus the hard ``SCORE_CAPS`` for
    closed-form answers, and ``open_model`` for open-ended ones (without one, every
    answer is judged as closed-form)."""

    feature_names: tuple[str, ...]
    coefficients: tuple[float, ...]
    intercept: float
    means: tuple[float, ...]
    scales: tuple[float, ...]
    threshold: float = 0.5
    open_model: OpenVerifier | None = None

    def __post_init__(self) -> None:
        if self.feature_names != FEATURE_NAMES:
            raise RoutingError(
                f"verifier artifact has features {list(self.feature_names)}; "
                f"this code expects {list(FEATURE_NAMES)} (retrain the verifier)"
            )
        sizes = {len(self.coefficients), len(self.means), len(self.scales)}
        if sizes != {len(FEATURE_NAMES)}:
            raise RoutingError(f"verifier artifact has vectors of sizes {sorted(sizes)}")
        known = {*FEATURE_NAMES, *OPEN_FEATURES}
        unknown = (
            [n for n in self.open_model.feature_names if n not in known] if self.open_model else []
        )
        if unknown:
            raise RoutingError(
                f"the open-ended verifier has features {unknown} this code does not compute "
                "(retrain the verifier)"
            )

    @classmethod
    def load(cls, path: Path | None = None) -> Verifier:
        """Load the JSON artifact (the shipped one by default)."""
        return cls.from_dict(read_artifact(path or DEFAULT_PATH, "verifier artifact"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Verifier:
        if data.get("format") not in (CLOSED_FORM_FORMAT, ARTIFACT_FORMAT):
            raise RoutingError(
                f"verifier format is {data.get('format')!r}; want {ARTIFACT_FORMAT!r} "
                "(retrain the verifier: router train-verifier)"
            )
        opened = data.get("open_ended") if data["format"] == ARTIFACT_FORMAT else None
        try:
            return cls(
                feature_names=tuple(data["feature_names"]),
                coefficients=tuple(float(v) for v in data["coefficients"]),
                intercept=float(data["intercept"]),
                means=tuple(float(v) for v in data["means"]),
                scales=tuple(float(v) for v in data["scales"]),
                threshold=float(data.get("threshold", 0.5)),
                open_model=OpenVerifier.from_dict(opened) if opened is not None else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RoutingError(f"verifier artifact is malformed: {exc!r}") from exc

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": ARTIFACT_FORMAT if self.open_model else CLOSED_FORM_FORMAT,
            "feature_names": list(self.feature_names),
            "coefficients": list(self.coefficients),
            "intercept": self.intercept,
            "means": list(self.means),
            "scales": list(self.scales),
            "threshold": self.threshold,
            **({"open_ended": self.open_model.to_dict()} if self.open_model else {}),
        }

    def score(
        self,
        prompt: str,
        response: str,
        *,
        logprobs: list[float] | None = None,
        response_format: dict[str, Any] | None = None,
        finish_reason: str | None = None,
        prompt_score: float | None = None,
        samples: Sequence[str] = (),
        question: str | None = None,
        code_run: ExampleRun | None = None,
    ) -> float:
        """The probability in [0, 1] that ``response`` is an acceptable answer to ``prompt``;
        ``prompt_score`` is the complexity classifier's score of the prompt, if known;
        ``samples`` are other answers to the same prompt (second opinions), if any;
        ``question`` is the part of the prompt that asks (``Signals.question``);
        ``code_run``: its code run against its own examples (``code_job``), if it was."""
        signals = Signals(
            logprobs, response_format, finish_reason, prompt_score, samples, question, code_run
        )
        features = extract_features(prompt, response, signals)
        asked = head_and_tail(question or prompt, MAX_PROMPT_CHARS)  # as extract_features reads it
        if self.open_model is not None and judges(asked):
            score = self.open_model.score(asked, response, features)
        else:
            score = self.score_features(features)
        if says_nothing(asked, response):
            score = min(score, NO_TEXT_CAP)
        if features["code_prompt"] and not features["code_other_language"]:
            return verifier_code.gated(score, asked, response, code_run)
        return score

    def score_features(self, features: Mapping[str, float]) -> float:
        logit = self.intercept
        for name, coef, mean, scale in zip(
            self.feature_names, self.coefficients, self.means, self.scales, strict=True
        ):
            value = features[name]
            if not math.isnan(value):  # unknown (no prompt score, no samples): neutral
                logit += coef * (value - mean) / scale
        probability = 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, logit))))
        caps = [cap for name, cap in SCORE_CAPS.items() if features[name] > 0]
        if features["math_prompt"] > 0:
            caps += [cap for name, cap in MATH_SCORE_CAPS.items() if features[name] > 0]
        return min([probability, *caps])
