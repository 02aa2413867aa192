"""The verifier's judgement of open-ended answers (``router.answers.open_ended``).

A linear model over the closed-form verifier's text signals that apply to any answer
(``router.verifier.extract_features``: truncation, refusals, repetition, the prompt's
prior) and the open-ended ones (``router.open_features``), learned from GPT-4-graded
Chatbot Arena answers (``router.training.open_verifier_train``). Its output is the logit of
"GPT-4 would grade this answer at least ``accept_grade`` of 10" (training calibrates
it so); the fixed logprob priors are added and the hard caps applied, so it is a
probability like the closed-form model's and one route threshold serves both.
The weights are the ``open_ended`` section of ``router/models/verifier.json``.

    if judges(question):
        model = OpenVerifier.from_dict(artifact["open_ended"])
        model.score(question, answer, closed_features)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from router.answers import open_ended
from router.errors import RoutingError
from router.open_features import open_features

SECTION_FORMAT = "open-verifier/1"
# The shortest graded prompt has 42 characters: a greeting or a one-line question ("What
# is the capital of France?") is outside what the model learned (its answers' length is
# read against the prompt's, and a right one-liner scored 0.46), so it keeps the
# closed-form judgement, as before the model.
MIN_PROMPT_CHARS = 40
# Logit per raw unit of the closed-form verifier's logprob signals (centred there, so 0
# when the upstream sent none): the graded answers carry no logprobs to learn them from,
# so they weigh as in the closed-form model.
PRIOR_COEFFICIENTS: dict[str, float] = {
    "logprob_mean": 1.5,
    "logprob_min": 0.1,
    "logprob_low_share": -4.0,
}
# Hard rules: when the feature is set, the score is at most this value. As the
# closed-form model's, but for refusals and loops, measured on the graded answers: one
# that opens by declining often goes on to help (those average 4.9 of 10, against 6.1
# for all), a short one does not (1.5); four repeated lines are often a table or code
# (5.5), 4-grams repeated over half the time a loop (1.9). An answer without a letter or
# digit is capped for both models by `Verifier.score` (`verifier.NO_TEXT_CAP`).
SCORE_CAPS: dict[str, float] = {
    "empty": 0.01,
    "json_invalid": 0.05,
    "json_schema_mismatch": 0.1,
    "short_refusal": 0.2,
    "finish_length": 0.3,
    "code_stub": 0.2,
}
LOOP_REPETITION = 0.5  # the share of repeated 4-grams (``repetition``) of a loop
LOOP_CAP = 0.3


def judges(question: str) -> bool:
    """Whether the open-ended model judges answers to ``question`` (the user's turns):
    an open-ended one (``answers.open_ended``) of at least ``MIN_PROMPT_CHARS``."""
    return len(question.strip()) >= MIN_PROMPT_CHARS and open_ended(question)


@dataclass(frozen=True)
class OpenVerifier:
    """A linear model over ``feature_names`` (closed-form and open-ended signals) giving
    the logit of a grade at least ``accept_grade``; ``recipe`` names how it was built."""

    feature_names: tuple[str, ...]
    coefficients: tuple[float, ...]
    intercept: float
    means: tuple[float, ...]
    scales: tuple[float, ...]
    accept_grade: float = 8.0
    recipe: str = ""

    def __post_init__(self) -> None:
        sizes = {len(self.coefficients), len(self.means), len(self.scales)}
        if sizes != {len(self.feature_names)}:
            raise RoutingError(f"open-ended verifier has vectors of sizes {sorted(sizes)}")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OpenVerifier:
        """The artifact's ``open_ended`` section (its feature names are checked by
        ``Verifier``, which knows the closed-form ones)."""
        if data.get("format") != SECTION_FORMAT:
            raise RoutingError(
                f"open-ended verifier format is {data.get('format')!r}; want {SECTION_FORMAT!r}"
            )
        try:
            return cls(
                feature_names=tuple(data["feature_names"]),
                coefficients=tuple(float(v) for v in data["coefficients"]),
                intercept=float(data["intercept"]),
                means=tuple(float(v) for v in data["means"]),
                scales=tuple(float(v) for v in data["scales"]),
                accept_grade=float(data["accept_grade"]),
                recipe=str(data.get("recipe", "")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise RoutingError(f"open-ended verifier artifact is malformed: {exc!r}") from exc

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": SECTION_FORMAT,
            "recipe": self.recipe,
            "feature_names": list(self.feature_names),
            "coefficients": list(self.coefficients),
            "intercept": self.intercept,
            "means": list(self.means),
            "scales": list(self.scales),
            "accept_grade": self.accept_grade,
            "prior_coefficients": dict(PRIOR_COEFFICIENTS),
        }

    def score(self, question: str, response: str, closed: Mapping[str, float]) -> float:
        """The probability that ``response`` is a good answer to ``question`` (the user's
        turns); ``closed`` are its closed-form features (``verifier.extract_features``)."""
        needed = {*self.feature_names, *SCORE_CAPS}  # what it weighs and caps by
        return self.score_features({**closed, **open_features(question, response, needed)})

    def logit(self, features: Mapping[str, float]) -> float:
        """The linear model's output, before the priors and caps."""
        value = self.intercept
        for name, coef, mean, scale in zip(
            self.feature_names, self.coefficients, self.means, self.scales, strict=True
        ):
            if not math.isnan(features[name]):  # unknown (no prompt score): neutral
                value += coef * (features[name] - mean) / scale
        return value

    def score_features(self, features: Mapping[str, float]) -> float:
        logit = self.logit(features)
        logit += sum(coef * features[name] for name, coef in PRIOR_COEFFICIENTS.items())
        probability = 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, logit))))
        caps = [cap for name, cap in SCORE_CAPS.items() if features[name] > 0]
        if features["repetition"] > LOOP_REPETITION:
            caps.append(LOOP_CAP)
        return min([probability, *caps])
