"""Training for the open-ended verifier (``router.open_verifier``) on graded chat answers.

``arena_chat.jsonl`` holds hard Chatbot Arena prompts, each answered by about 13 models,
each answer graded 1-10 by GPT-4 against a reference. Every model's answer is a training
example (the grader's verdict on an open-ended answer), judged here without the reference.

The recipe (which signals, which target: the grade itself or "graded at least 7 / 8",
how much regularisation) is chosen by cross-validation inside the training prompts,
grouped by prompt (all answers of a prompt on one side), by the cascade the issue
measures: Mixtral-8x7B answers first, GPT-4 when the verifier rejects the answer (APGR).
A fixed quarter of the prompts (``is_final``) is kept out of every choice and fit: the
final split, judged once by the model of the chosen recipe fitted on the rest, which is
the one shipped.

    data = ArenaData.load(data_dir)
    recipe = choose_recipe(data, data.train_prompts)
    model = fit(recipe, data, data.train_prompts)
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from router.errors import RoutingError
from router.open_features import OPEN_FEATURES, open_features
from router.open_verifier import (
    LOOP_CAP,
    LOOP_REPETITION,
    PRIOR_COEFFICIENTS,
    SCORE_CAPS,
    OpenVerifier,
    judges,
)
from router.training.dataset import data_file, open_data
from router.training.evaluation import apgr, cascade_curve
from router.verifier import Verifier
from router.verifier_features import Signals, extract_features

ARENA_STEM = "arena_chat"  # ``dataset.data_file``: arena_chat.jsonl, or .jsonl.gz
ARENA_FILE = f"{ARENA_STEM}.jsonl"
WEAK_MODEL = "mistralai/Mixtral-8x7B-Instruct-v0.1"  # the pair the cascade uses
STRONG_MODEL = "gpt-4-1106-preview"
FINAL_BUCKETS = 4  # prompts whose hash is 0 mod this are the final split
FOLDS = 5
INNER_REPEATS = 2  # choosing a recipe: grouped 5-fold CV, this many shuffles
ACCEPT_GRADE = 8.0  # the score is the probability of a grade at least this
CALIBRATION_C = 1e6  # next to no penalty: two parameters, some 2,000 answers
SIGNIFICANT_DIGITS = 6

# The closed-form verifier's signals that apply to any answer; the rest are its
# maths, multiple-choice and code checks, or priors (logprobs, finish_reason, JSON).
CLOSED_SIGNALS = (
    "log_answer_chars",
    "ends_mid_sentence",
    "unbalanced_fences",
    "unbalanced_brackets",
    "refusal",
    "hedge",
    "repetition",
    "degenerate_loop",
    "empty",
    "prompt_difficulty",
)
# The answer's length relative to the prompt's, not its own: the graded answers are all
# to hard, long requests, where longer answers grade higher; by its own length a short
# right answer to a short question ("What is the capital of France?") scored 0.13.
TRUNCATION = (
    "length_ratio",
    "ends_mid_sentence",
    "unbalanced_fences",
    "unbalanced_brackets",
    "cut_off",
    "prompt_difficulty",
)
FEATURE_SETS: dict[str, tuple[str, ...]] = {
    "truncation": TRUNCATION,
    "truncation+refusal": (*TRUNCATION, "refusal", "short_refusal", "very_short_answer", "empty"),
    "all": (*CLOSED_SIGNALS, *OPEN_FEATURES),
}
COLUMNS: tuple[str, ...] = tuple(dict.fromkeys(n for s in FEATURE_SETS.values() for n in s))
# What the scores need besides the learned columns: the caps and priors.
EXTRA = tuple(n for n in (*SCORE_CAPS, *PRIOR_COEFFICIENTS, "repetition") if n not in COLUMNS)
RIDGE_ALPHAS = (1e3, 1e4, 1e5, 1e6)  # the largest: weights ~ each signal's covariance
LOGISTIC_CS = (0.01, 0.1)
ACCEPT_TARGETS = (7.0, 8.0)


@dataclass(frozen=True)
class Recipe:
    """Which signals (``FEATURE_SETS``), which target (None: regress the grade; else
    classify grade >= target) and the regularisation (ridge alpha, or logistic C)."""

    features: str
    target: float | None
    strength: float

    @property
    def name(self) -> str:
        if self.target is None:
            return f"ridge on the grade, {self.features}, alpha={self.strength:g}"
        return f"logistic, grade >= {self.target:g}, {self.features}, C={self.strength:g}"


RECIPES: tuple[Recipe, ...] = tuple(
    [Recipe(f, None, a) for f in FEATURE_SETS for a in RIDGE_ALPHAS]
    + [Recipe(f, t, c) for f in FEATURE_SETS for t in ACCEPT_TARGETS for c in LOGISTIC_CS]
)


@dataclass(frozen=True)
class GradedAnswer:
    """One model's answer to an arena prompt, with GPT-4's grade and its price."""

    prompt_id: str
    prompt: str
    model: str
    response: str
    grade: float
    cost_usd: float


@dataclass(frozen=True, eq=False)
class ArenaData:
    """The graded answers, their features (``COLUMNS`` then ``EXTRA``), and the
    closed-form features of each (what the verifier scores closed-form prompts by)."""

    answers: tuple[GradedAnswer, ...]
    features: NDArray[np.float64]
    closed_features: tuple[Mapping[str, float], ...]

    @classmethod
    def load(
        cls,
        data_dir: Path,
        prompt_scores: Mapping[str, float] | None = None,
        *,
        limit: int | None = None,
    ) -> ArenaData:
        """``data_dir``'s arena answers (of its first ``limit`` prompts by id);
        ``prompt_scores`` (prompt id -> the complexity classifier's score) default to
        the shipped classifier's."""
        rows = read_rows(data_file(data_dir, ARENA_STEM))[:limit]
        if prompt_scores is None:
            prompt_scores = classifier_scores(rows)
        return cls.build(graded_answers(rows), prompt_scores)

    @classmethod
    def build(
        cls, answers: Sequence[GradedAnswer], prompt_scores: Mapping[str, float]
    ) -> ArenaData:
        closed = tuple(
            extract_features(
                a.prompt, a.response, Signals(prompt_score=prompt_scores.get(a.prompt_id))
            )
            for a in answers
        )
        rows = [
            {**features, **open_features(a.prompt, a.response)}
            for a, features in zip(answers, closed, strict=True)
        ]
        matrix = np.array([[row[n] for n in (*COLUMNS, *EXTRA)] for row in rows], dtype=np.float64)
        return cls(tuple(answers), matrix.reshape(len(rows), len(COLUMNS) + len(EXTRA)), closed)

    @property
    def prompt_ids(self) -> NDArray[np.str_]:
        return np.array([a.prompt_id for a in self.answers])

    @property
    def train_prompts(self) -> frozenset[str]:
        return frozenset(a.prompt_id for a in self.answers if not is_final(a.prompt_id))

    @property
    def final_prompts(self) -> frozenset[str]:
        return frozenset(a.prompt_id for a in self.answers if is_final(a.prompt_id))

    def rows_of(self, prompts: frozenset[str]) -> NDArray[np.bool_]:
        return np.isin(self.prompt_ids, sorted(prompts))


def train_section(
    data_dir: Path,
    closed: Verifier,
    *,
    limit: int | None = None,
    prompt_scores: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """The artifact's ``open_ended`` section: the model of the recipe chosen by
    cross-validation, fitted on the training prompts, with its evaluation
    (``open_evaluation.evaluate``; ``closed``: the closed-form ``Verifier`` that keeps
    the closed-form prompts)."""
    from router.training.open_evaluation import evaluate, report_dict

    data = ArenaData.load(data_dir, prompt_scores, limit=limit)
    report = evaluate(data, closed)
    return {
        **report.model.to_dict(),
        "training": {
            "source": ARENA_FILE,
            "answers": len(data.answers),
            "train_prompts": len(data.train_prompts),
            "final_prompts": len(data.final_prompts),
            "prompt_prior": "given" if prompt_scores is not None else "shipped classifier",
        },
        "evaluation": report_dict(report),
    }


def read_rows(path: Path) -> list[dict[str, Any]]:
    try:
        with open_data(path) as text:
            lines = text.read().splitlines()
    except OSError as exc:
        raise RoutingError(f"cannot read training data {path}: {exc}") from exc
    return sorted((json.loads(line) for line in lines if line.strip()), key=lambda r: r["id"])


def graded_answers(rows: Sequence[Mapping[str, Any]]) -> list[GradedAnswer]:
    """Every model's answer of every row, in a fixed order."""
    return [
        GradedAnswer(
            row["id"],
            row["prompt"],
            name,
            answer["response"],
            float(answer["score"]),
            float(answer["cost_usd"]),
        )
        for row in rows
        for name, answer in sorted(row["models"].items())
    ]


def classifier_scores(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The shipped classifier's score of each prompt (it never trained on arena chat):
    the verifier's prior, as the gateway and ``router verify`` pass it."""
    from router.classifier import Classifier

    requests = [{"messages": [{"role": "user", "content": row["prompt"]}]} for row in rows]
    scores = Classifier.load().score_batch(requests)
    return {row["id"]: score for row, score in zip(rows, scores, strict=True)}


def is_final(prompt_id: str) -> bool:
    """The final split: prompts whose ``sha256("arena_chat:" + id)`` first byte is 0 mod
    ``FINAL_BUCKETS`` (a quarter), touched once, never chosen or fitted on."""
    digest = hashlib.sha256(f"arena_chat:{prompt_id}".encode()).digest()
    return digest[0] % FINAL_BUCKETS == 0


def prompt_folds(prompts: frozenset[str], folds: int, seed: int) -> list[frozenset[str]]:
    """``prompts`` shuffled (``seed``) into ``folds`` groups: a prompt, and so all of its
    answers, is in exactly one."""
    order = sorted(prompts)
    np.random.default_rng(seed).shuffle(order)
    return [frozenset(order[k::folds]) for k in range(folds)]


def fit(recipe: Recipe, data: ArenaData, prompts: frozenset[str]) -> OpenVerifier:
    """The recipe fitted on every answer to ``prompts`` (each weighing alike),
    then calibrated: its output scaled and shifted (a one-feature logistic fit) to the
    logit of a grade at least ``ACCEPT_GRADE``."""
    names = FEATURE_SETS[recipe.features]
    rows = data.rows_of(prompts)
    columns = data.features[rows][:, [COLUMNS.index(n) for n in names]]
    grades = np.array([a.grade for a in data.answers], dtype=np.float64)[rows]
    with warnings.catch_warnings():  # a column with no known value (no prompt scores)
        warnings.simplefilter("ignore", RuntimeWarning)
        means, scales = np.nanmean(columns, axis=0), np.nanstd(columns, axis=0)
    means[np.isnan(means)] = 0.0
    scales[~(scales > 0)] = 1.0
    standard = np.nan_to_num((columns - means) / scales, nan=0.0)
    if recipe.target is None:
        coefficients, intercept = _ridge(standard, grades, recipe.strength)
    else:
        coefficients, intercept = _logistic(standard, grades >= recipe.target, recipe.strength)
    linear = standard @ coefficients + intercept
    (slope,), offset = _logistic(linear[:, None], grades >= ACCEPT_GRADE, CALIBRATION_C)
    return OpenVerifier(
        feature_names=names,
        coefficients=tuple(_round(float(slope * c)) for c in coefficients),
        intercept=_round(slope * intercept + offset),
        means=tuple(_round(float(m)) for m in means),
        scales=tuple(_round(float(s)) for s in scales),
        accept_grade=ACCEPT_GRADE,
        recipe=recipe.name,
    )


def _ridge(
    x: NDArray[np.float64], y: NDArray[np.float64], alpha: float
) -> tuple[NDArray[np.float64], float]:
    """Ridge regression with an unpenalised intercept (closed form)."""
    centred = x - x.mean(axis=0)
    gram = centred.T @ centred + alpha * np.eye(x.shape[1])
    coefficients = np.linalg.solve(gram, centred.T @ (y - y.mean()))
    return coefficients, float(y.mean() - x.mean(axis=0) @ coefficients)


def _logistic(
    x: NDArray[np.float64], accepted: NDArray[np.bool_], c: float
) -> tuple[NDArray[np.float64], float]:
    """L2-penalised logistic regression (scikit-learn's objective: the log-loss summed
    plus the squared weights over 2C, intercept unpenalised), by Newton's method."""
    design = np.column_stack([x, np.ones(len(x))])
    penalty = np.eye(design.shape[1]) / c
    penalty[-1, -1] = 0.0
    y = accepted.astype(np.float64)
    weights = np.zeros(design.shape[1])
    for _ in range(100):
        p = 1.0 / (1.0 + np.exp(-np.clip(design @ weights, -50.0, 50.0)))
        gradient = design.T @ (y - p) - penalty @ weights
        hessian = (
            (design * (p * (1.0 - p))[:, None]).T @ design + penalty + 1e-9 * np.eye(len(weights))
        )
        step = np.linalg.solve(hessian, gradient)
        weights += step
        if np.abs(step).max() < 1e-9:
            break
    return weights[:-1], float(weights[-1])


def scores(model: OpenVerifier, data: ArenaData, rows: NDArray[np.bool_]) -> NDArray[np.float64]:
    """``model``'s score of each answer in ``rows``: ``OpenVerifier.score_features``,
    vectorised over the cached features."""
    every = (*COLUMNS, *EXTRA)
    values = data.features[rows]
    linear = np.full(len(values), model.intercept)
    for name, coef, mean, scale in zip(
        model.feature_names, model.coefficients, model.means, model.scales, strict=True
    ):
        column = values[:, every.index(name)]
        linear += np.where(np.isnan(column), 0.0, coef * (column - mean) / scale)
    logit = linear
    for name, coef in PRIOR_COEFFICIENTS.items():
        logit += coef * values[:, every.index(name)]
    probability = 1.0 / (1.0 + np.exp(-np.clip(logit, -50.0, 50.0)))
    capped = [(values[:, every.index(name)] > 0, cap) for name, cap in SCORE_CAPS.items()]
    capped.append((values[:, every.index("repetition")] > LOOP_REPETITION, LOOP_CAP))
    for rule, cap in capped:
        probability = np.where(rule, np.minimum(probability, cap), probability)
    return np.asarray(probability, dtype=np.float64)


def out_of_fold(
    recipe: Recipe, data: ArenaData, prompts: frozenset[str], seed: int
) -> NDArray[np.float64]:
    """Every answer to ``prompts`` scored by the recipe fitted on the other folds of a
    grouped ``FOLDS``-fold split (NaN elsewhere)."""
    result = np.full(len(data.answers), np.nan)
    for test in prompt_folds(prompts, FOLDS, seed):
        rows = data.rows_of(test)
        result[rows] = scores(fit(recipe, data, prompts - test), data, rows)
    return result


def choose_recipe(data: ArenaData, prompts: frozenset[str]) -> Recipe:
    """The recipe whose out-of-fold scores give the Mixtral -> GPT-4 cascade on
    ``prompts`` the best APGR, averaged over ``INNER_REPEATS`` shuffles of the folds
    (ties: the first in ``RECIPES``, simpler feature sets first)."""

    def quality(recipe: Recipe) -> float:
        runs = [
            pair_apgr(data, out_of_fold(recipe, data, prompts, 100 + r), prompts)
            for r in range(INNER_REPEATS)
        ]
        return float(np.mean(runs))

    results = [quality(recipe) for recipe in RECIPES]
    return RECIPES[int(np.nanargmax(results))]


@dataclass(frozen=True)
class Pairs:
    """The cascade's rows on some prompts: the weak and strong answers' indices."""

    prompts: tuple[str, ...]
    weak: NDArray[np.int64]
    strong: NDArray[np.int64]

    @classmethod
    def of(cls, data: ArenaData, prompts: frozenset[str]) -> Pairs:
        index = {(a.prompt_id, a.model): i for i, a in enumerate(data.answers)}
        kept = sorted(p for p in prompts if (p, WEAK_MODEL) in index and (p, STRONG_MODEL) in index)
        weak = np.array([index[p, WEAK_MODEL] for p in kept], dtype=np.int64)
        strong = np.array([index[p, STRONG_MODEL] for p in kept], dtype=np.int64)
        return cls(tuple(kept), weak, strong)

    def columns(self, data: ArenaData) -> tuple[NDArray[np.float64], ...]:
        """Weak and strong grades and costs, aligned with ``prompts``."""
        grade = np.array([a.grade for a in data.answers], dtype=np.float64)
        cost = np.array([a.cost_usd for a in data.answers], dtype=np.float64)
        return grade[self.weak], grade[self.strong], cost[self.weak], cost[self.strong]


def pair_apgr(
    data: ArenaData, answer_scores: NDArray[np.float64], prompts: frozenset[str]
) -> float:
    """APGR of the Mixtral -> GPT-4 cascade on ``prompts``, each Mixtral answer scored
    by ``answer_scores`` (aligned with ``data.answers``)."""
    pairs = Pairs.of(data, prompts)
    curve = cascade_curve(answer_scores[pairs.weak], *pairs.columns(data)).curve
    return apgr(curve) if curve.share[-1] > curve.share[0] else math.nan


def dispatched(
    data: ArenaData, open_scores: NDArray[np.float64], closed: Verifier
) -> NDArray[np.float64]:
    """The verifier's score of each answer: ``open_scores`` where the open-ended model
    judges the prompt (``open_verifier.judges``), else the closed-form model's."""
    result = np.array(open_scores, dtype=np.float64)
    for i, answer in enumerate(data.answers):
        if not judges(answer.prompt):
            result[i] = closed.score_features(data.closed_features[i])
    return result


def _round(value: float) -> float:
    return float(f"{value:.{SIGNIFICANT_DIGITS}g}")
