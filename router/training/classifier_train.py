"""Train the complexity classifier and judge it on prompts it has not seen.

Deterministic: the same data gives a byte-identical model file (fixed solver, no
randomness in the features or the fit, coefficients rounded on save).

    classifier, reports = train(data_dir, out=Path("router/models/classifier.json"))
"""

from __future__ import annotations

import datetime
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

from router.artifacts import DEFAULTS_LINK
from router.classifier import Classifier
from router.errors import RoutingError
from router.features import (
    DENSE_NAMES,
    HASH_FEATURES,
    MAX_TOKENS_READ,
    RequestFeatures,
    extract,
)
from router.training.dataset import (
    MMLU_SELECTION_GROUPS,
    Example,
    Fold,
    PromptScores,
    data_digest,
    evaluation_folds,
    selection_folds,
    subject_folds,
    training_pool,
)
from router.training.evaluation import (
    INTERVAL_HEADERS,
    Curve,
    Intervals,
    Metrics,
    evaluate,
    format_intervals,
    length_scores,
    random_curve,
    random_metrics,
    route_curve,
    route_intervals,
)
from router.training.gain_regression import fit_gain, sign_consistent

FeatureSetType = Literal["all", "sign-consistent"]


@dataclass(frozen=True, slots=True)
class Recipe:
    """The choices made by cross-validation inside the training pool."""

    feature_set: FeatureSetType
    ridge: float
    shrink_to_length: bool = False


RIDGE_GRID = (0.01, 0.1, 1.0)
# The candidates `choose_recipe` compares, simplest first (it keeps the first of a tie).
RECIPES = tuple(
    Recipe(feature_set, ridge, to_length)
    for to_length in (False, True)
    for feature_set in ("all", "sign-consistent")
    for ridge in RIDGE_GRID
)
LENGTH_COLUMN = DENSE_NAMES.index("log_chars")  # the length router's signal
# Fixed weights (logit per unit, and the highest value read) for what the training data
# never varies (single user prompts: no tools, system prompt, JSON mode or max_tokens),
# used while a feature is constant in training; retraining on traffic that varies them
# learns them instead. Tools and JSON output ask more of a model; a small `max_tokens`
# asks for a short answer (neutral at 512 tokens, -0.5 at 16, +0.3 at 4096); a system
# prompt (shared by a route's requests) adds a little.
PRIOR_WEIGHTS: dict[str, tuple[float, float]] = {
    "has_tools": (0.3, 1.0),
    "log_tools": (0.1, math.log1p(128)),
    "json_output": (0.3, 1.0),
    "log_max_tokens": (0.15, math.log1p(MAX_TOKENS_READ)),
    "has_max_tokens": (-0.15 * math.log1p(512), 1.0),
    "has_system": (0.1, 1.0),
    "log_system_chars": (0.03, math.log1p(1_000_000)),
}
ROUTERS = ("classifier", "random", "length")


@dataclass(frozen=True, slots=True)
class FoldReport:
    """One held-out dataset: its size, the two models' quality, each router's result."""

    name: str
    rows: int
    weak_quality: float
    strong_quality: float
    metrics: Mapping[str, Metrics]
    curves: Mapping[str, Curve]
    # Bootstrap intervals per router (none for the random router: its figure is a mean
    # over seeds, and its spread is the seeds', not the prompts').
    intervals: Mapping[str, Intervals] = field(default_factory=dict)


class FeatureCache:
    """Features of each training prompt, extracted once and shared by all folds."""

    def __init__(self, examples: Sequence[Example]) -> None:
        self._features = {e.id: extract([{"role": "user", "content": e.prompt}]) for e in examples}

    def get(self, example: Example) -> RequestFeatures:
        return self._features[example.id]


def fit(
    examples: Sequence[Example], cache: FeatureCache, recipe: Recipe | None = None
) -> Classifier:
    """Within-task gain regression (`router.training.gain_regression`), then a logistic map of its
    output to P(needs the strong model), so scores stay in [0, 1] in the same order.

    Without a `recipe` the feature set and ridge strength are chosen by `choose_recipe`
    on these same examples (so an evaluation fold never sees its test rows, even there).
    """
    recipe = recipe or choose_recipe(examples, cache)
    rows = list(examples)
    dense = np.vstack([cache.get(e).dense for e in rows])
    mean, scale = dense.mean(axis=0), dense.std(axis=0)
    scale[scale < 1e-9] = 1.0  # constant in training (e.g. tools): weight stays 0
    coef = _gain_coef(rows, (dense - mean) / scale, recipe)
    slope, intercept = _probability_map(rows, (dense - mean) / scale @ coef)
    coef, low, high = slope * coef, dense.min(axis=0), dense.max(axis=0)
    for name, (weight, highest) in PRIOR_WEIGHTS.items():
        i = DENSE_NAMES.index(name)
        if np.ptp(dense[:, i]) < 1e-9:  # constant in training: the prior stands in
            coef[i], low[i], high[i] = weight, min(low[i], 0.0), highest
    fitted = Classifier(
        dense_mean=mean,
        dense_scale=scale,
        dense_coef=coef,
        hash_coef=np.zeros(HASH_FEATURES),
        intercept=intercept,
        training=_summary(rows, recipe),
        dense_low=low,
        dense_high=high,
    )
    # What ships is the rounded JSON, so judge and return exactly that.
    return Classifier.from_dict(fitted.to_dict())


def choose_recipe(examples: Sequence[Example], cache: FeatureCache) -> Recipe:
    """The recipe with the best mean APGR over `selection_folds` (one figure per dataset,
    MMLU's subject groups averaged first); ties go to the earlier, simpler one."""
    rows = list(examples)
    dense = np.vstack([cache.get(e).dense for e in rows])
    index = {e.id: i for i, e in enumerate(rows)}
    folds = selection_folds(rows)
    best: tuple[float, Recipe] | None = None
    for recipe in RECIPES:
        per_dataset: dict[str, list[float]] = {}
        for fold in folds:
            train = np.array([index[e.id] for e in fold.train])
            test = np.array([index[e.id] for e in fold.test])
            scores = _fold_scores(fold, dense[train], dense[test], recipe)
            metrics = evaluate(
                scores, [e.weak_correct for e in fold.test], [e.strong_correct for e in fold.test]
            )
            per_dataset.setdefault(fold.test[0].dataset, []).append(metrics.apgr)
        value = float(np.mean([np.mean(v) for v in per_dataset.values()]))
        if best is None or value > best[0] + 1e-12:
            best = (value, recipe)
    if best is None:
        raise RoutingError("cannot choose a classifier recipe: no selection folds")
    return best[1]


def _fold_scores(fold: Fold, train: np.ndarray, test: np.ndarray, recipe: Recipe) -> np.ndarray:
    mean, scale = train.mean(axis=0), train.std(axis=0)
    scale[scale < 1e-9] = 1.0
    coef = _gain_coef(list(fold.train), (train - mean) / scale, recipe)
    return np.asarray((test - mean) / scale @ coef)


def _gain_coef(rows: Sequence[Example], x: np.ndarray, recipe: Recipe) -> np.ndarray:
    gain = np.array([e.gain for e in rows])
    _, groups = np.unique([e.dataset for e in rows], return_inverse=True)
    columns = x.std(axis=0) > 1e-12
    if recipe.feature_set == "sign-consistent":
        columns &= sign_consistent(x, gain, groups)
    weights = _dataset_weights(rows)
    toward = LENGTH_COLUMN if recipe.shrink_to_length else None
    return fit_gain(x, gain, groups, weights, ridge=recipe.ridge, columns=columns, toward=toward)


def _probability_map(rows: Sequence[Example], gain_score: np.ndarray) -> tuple[float, float]:
    """Slope and intercept of a logistic fit of the label on the gain score (labelled rows,
    dataset-balanced). The slope is kept positive so the map never reverses the order."""
    from sklearn.linear_model import LogisticRegression  # only training needs sklearn

    labelled = np.array([e.label is not None for e in rows])
    labels = [e.label for e in rows if e.label is not None]
    weights = _dataset_weights([e for e in rows if e.label is not None])
    model = LogisticRegression(C=1e6, solver="lbfgs", max_iter=1000, tol=1e-10)
    model.fit(gain_score[labelled, None], labels, sample_weight=weights)
    slope = float(model.coef_[0, 0])
    if slope <= 0.0:  # the pooled label disagrees with the within-task order: keep the order
        slope = 1.0 / max(float(gain_score.std()), 1e-12)
    return slope, float(model.intercept_[0])


FittedFolds = list[tuple[Fold, Classifier]]


def fit_folds(
    examples: Sequence[Example], cache: FeatureCache, folds: Sequence[Fold] | None = None
) -> FittedFolds:
    """Each fold (by default the evaluation folds) with the classifier trained on its
    training side only."""
    folds = evaluation_folds(examples) if folds is None else folds
    return [(fold, fit(fold.train, cache)) for fold in folds]


def held_out_scores(fitted: FittedFolds) -> dict[tuple[str, str], float]:
    """Every held-out prompt's score by the classifier that never saw it (for the
    non-MMLU datasets, one trained without that whole dataset)."""
    return {
        (e.dataset, e.id): classifier.score([{"role": "user", "content": e.prompt}])
        for fold, classifier in fitted
        for e in fold.test
    }


def run_evaluation(
    examples: Sequence[Example], cache: FeatureCache, fitted: FittedFolds | None = None
) -> list[FoldReport]:
    fitted = fitted or fit_folds(examples, cache)
    scores = held_out_scores(fitted)
    return [_judge(fold, scores) for fold, _ in fitted]


def run_subject_evaluation(examples: Sequence[Example], cache: FeatureCache) -> list[FoldReport]:
    """The recipe on the training pool's MMLU subjects, a group at a time left out
    (`dataset.subject_folds`): more draws of unseen subjects than the one held-out set."""
    return run_evaluation(
        examples, cache, fit_folds(examples, cache, subject_folds(training_pool(examples)))
    )


def train(data_dir: Path | None, out: Path, examples: Sequence[Example]) -> list[FoldReport]:
    """Fit the shipped model on the training pool, evaluate the recipe, write both files."""
    cache = FeatureCache(examples)
    classifier = fit(training_pool(examples), cache)
    training = {**classifier.training, "data_sha256_12": data_digest(data_dir)}
    classifier = Classifier.from_dict({**classifier.to_dict(), "training": training})
    classifier.save(out)
    reports = run_evaluation(examples, cache)
    subjects = run_subject_evaluation(examples, cache)
    card = model_card(classifier, reports, subjects)
    out.with_suffix(".card.md").write_text(card, encoding="utf-8")
    return reports


def format_table(reports: Sequence[FoldReport], routers: Sequence[str] = ROUTERS) -> str:
    lines = [
        "| held-out dataset | rows | weak | strong | router | APGR | CPT(50%) | CPT(80%) "
        f"| {INTERVAL_HEADERS} |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in reports:
        for router in routers:
            m = r.metrics[router]
            lines.append(
                f"| {r.name} | {r.rows} | {r.weak_quality:.3f} | {r.strong_quality:.3f} | "
                f"{router} | {m.apgr:.3f} | {m.cpt50:.1%} | {m.cpt80:.1%} | "
                f"{format_intervals(r.intervals.get(router))} |"
            )
    return "\n".join(lines)


def _judge(fold: Fold, held_out: PromptScores) -> FoldReport:
    weak = [e.weak_correct for e in fold.test]
    strong = [e.strong_correct for e in fold.test]
    scores = {
        "classifier": [held_out[e.dataset, e.id] for e in fold.test],
        "length": length_scores([e.prompt for e in fold.test]).tolist(),
    }
    metrics = {name: evaluate(s, weak, strong) for name, s in scores.items()}
    curves = {name: route_curve(s, weak, strong) for name, s in scores.items()}
    intervals = {name: route_intervals(s, weak, strong) for name, s in scores.items()}
    metrics["random"] = random_metrics(weak, strong)
    curves["random"] = random_curve(weak, strong)
    quality = curves["random"]
    return FoldReport(
        fold.name,
        len(fold.test),
        quality.weak_quality,
        quality.strong_quality,
        metrics,
        curves,
        intervals,
    )


def _dataset_weights(rows: Sequence[Example]) -> np.ndarray:
    """Each dataset weighs the same in total, so MMLU's 10k rows do not drown the rest."""
    sizes = Counter(e.dataset for e in rows)
    return np.array([len(rows) / (len(sizes) * sizes[e.dataset]) for e in rows])


def _summary(rows: Sequence[Example], recipe: Recipe) -> dict[str, object]:
    return {
        "rows": len(rows),
        "positives": sum(e.label or 0 for e in rows),
        "datasets": dict(sorted(Counter(e.dataset for e in rows).items())),
        "model": (
            f"within-dataset ridge on the gain (ridge {recipe.ridge:g} towards "
            f"{'the length router' if recipe.shrink_to_length else 'zero'}, "
            f"{recipe.feature_set} features), dataset-balanced weights, logistic map to [0, 1]"
        ),
        "recipe": {
            "feature_set": recipe.feature_set,
            "ridge": recipe.ridge,
            "shrink_to_length": recipe.shrink_to_length,
        },
    }


def model_card(
    classifier: Classifier, reports: Sequence[FoldReport], subjects: Sequence[FoldReport]
) -> str:
    today = datetime.date.today().isoformat()
    t = classifier.training
    return (
        CARD.format(
            date=today,
            rows=t.get("rows"),
            positives=t.get("positives"),
            datasets=", ".join(f"{k} {v}" for k, v in dict(t.get("datasets", {})).items()),
            model=t.get("model"),
            recipe=t.get("recipe"),
            sha=t.get("data_sha256_12"),
            table=format_table(reports),
            subject_table=format_table(subjects),
            groups=MMLU_SELECTION_GROUPS,
        )
        + DEFAULTS_LINK
    )


CARD = """# Complexity classifier: model card

Trained {date} by `cascade-gateway router train` (rebuild: the same command; the same
data gives a byte-identical `classifier.json`). Data SHA-256 (first 12 hex digits): `{sha}`.

## What it is
{model} over the dense part of `router/features.py` (feature version in the JSON): ~35
structural features of the whole conversation (lengths, turns, system prompt, code /
maths / reasoning markers, multiple-choice shape, non-ASCII share, requested output
length, tools, JSON output) and ~20 of the question block (the last blank-line block of
the last user turn: its length, stem and option lengths, numbers, sentences, negations,
"I and II" combinations, context length before it). No hashed n-grams: they memorised
subjects and inverted on unseen ones. The score is P(the request needs the strong
model), a logistic map of the within-task gain estimate (monotone: it keeps the order).

How it is fitted (`router/training/gain_regression.py`): the target is the gain, strong_correct
- weak_correct, or on RouterBench rows (which carry 11 models' answers) GPT-4's
correctness minus the mean correctness of the cheap pool (every model under half
GPT-4's cost on that task, Mixtral included: 8 models, 9 on MBPP): one pair's 0/1 outcome says
little about a prompt, eight say how much a strong model buys on it (when adopted: held-out
MMLU APGR 0.683 -> 0.773, the others within +-0.03). Features and gain are centred
within each training dataset, so the
weights learn which prompts of a task gain most from the strong model rather than which
task a prompt comes from (the two are confounded across these datasets). The feature set
(all, or only those whose within-dataset correlation with the gain has one sign in all
training datasets but one), the ridge strength and whether it shrinks towards zero or
towards the prompt-length router are chosen by cross-validation inside the training
rows only (`dataset.selection_folds`: each non-MMLU dataset left out in turn, MMLU
subjects in 3 groups). Chosen for the shipped model: {recipe}.

## Data and label
`router/data/` (MMLU, GSM8K, RouterBench ARC-Challenge, Winogrande, MBPP;
weak = Mixtral-8x7B, strong = GPT-4). Label 1 when only the strong model answered
correctly, 0 when the weak one did. The regression uses every row through the gain
(both wrong = 0: routing them either way gives the same quality; pooled on RouterBench,
see above); the logistic map uses
the labelled rows only. All rows stay in the evaluation. Training rows: {rows} ({positives}
positive): {datasets}.

## Split
- MMLU: 12 of the 40 subjects (those whose SHA-256 first byte mod 10 < 3) are held
  out; the shipped model never saw them. The `mmlu` row below is the shipped model.
- GSM8K, ARC-Challenge, Winogrande, MBPP: leave-one-dataset-out. The row for each is a
  model of the same recipe trained on the pool without that dataset (the shipped model
  trains on all four, so those rows estimate how it does on an unseen kind of task).
- Every row's model chose its own recipe by cross-validation on its own training rows,
  so no held-out row took part in choosing (the choice can differ between rows).
- Metrics as RouteLLM's evaluate.py: 11 decile thresholds, trapezoid AUC over the
  strong-call share, CPT by linear interpolation along the curve. Random = mean of 10
  seeds; length = longer prompt first.
- 90% CI: the central 90% of each figure over 200 bootstrap resamples of the held-out
  prompts (seed 0), the router's scores fixed: how much the figure owes to which
  prompts were drawn, not to training. A target a figure misses inside its interval is
  missed within that noise.

## Held-out results
{table}

## Unseen MMLU subjects, more draws
The training pool's MMLU subjects in {groups} groups (by a second byte of the subject
hash), each group judged by a model of the same recipe trained on the pool without it
(its recipe chosen by cross-validation on its own training rows). The shipped model
saw these subjects; the rows say how the recipe does on subjects it has not seen, drawn
{groups} more times.

{subject_table}

## Limits
System prompt, tools, `response_format` and `max_tokens` features are constant in this
data (single user prompts), so they carry fixed prior weights (`PRIOR_WEIGHTS` in
`router/training/classifier_train.py`: tools and JSON output raise the score, a small
`max_tokens` lowers it) until training data that varies them replaces the priors with
learned weights. Every feature is clipped into the range training saw (the JSON's
`dense_low` / `dense_high`), so a request unlike any training prompt (another script, a
prompt longer than any) weighs as the most extreme training one did. Prompt
length largely identifies the dataset here; the per-dataset curves are what to trust.
The within-task signal in these prompts is weak (every feature's within-dataset
correlation with the gain is at most about 0.16 in absolute value) and the labels are single
samples, so APGR differences of a few hundredths between routers are within noise,
especially on MBPP (299 rows). The held-out MMLU subjects include
high_school_mathematics (270 of 2271 rows), where GPT-4 scores 3% (one-token answer
extraction) and the weak model 32%: any router that sends short maths questions to the
weak model gains there, and the held-out `mmlu` row owes most of its lead over the
subject-group rows to that one subject. No training subject has such an artefact; the
subject-group rows are the typical figure for MMLU subjects the router has not seen.
"""
