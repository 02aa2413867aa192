"""Train the quality predictor (`router.quality`) and judge it on prompts it never saw.

Three families of recipe, each a `QualityPredictor` (task posterior x task table, plus a
linear deviation):

- ``prior``: each model's mean quality on the kind of prompt (a softmax over the
  training datasets, read from the prompt's dense features), nothing per prompt;
- ``gain``: the prior plus one per-prompt direction, the strong model's within-task gain
  over the cheap models (`router.training.gain_regression`, as the complexity classifier learns
  it), each model moving along it by its own fitted sensitivity; ``beta`` scales it;
- ``heads``: the prior plus a ridge head per model on the residual, ``ridge`` its penalty.

Which recipe, and its strength, is chosen by cross-validation inside the training rows
(`quality_data.inner_folds`), by the saving at 93%, 95% and 97% of the strong model's
quality (`router.training.quality_evaluation`), averaged over the datasets with costs. The
reported figures are nested: each outer fold chooses its own recipe on its own training
rows. The final split is judged once, by the shipped model.

Deterministic: the same data gives a byte-identical model file (zero-initialised full
batch fits, fixed step counts, coefficients rounded on save).

    predictor, folds, final = train(table, dense_features(table))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from router.errors import RoutingError
from router.features import FloatArray, IntArray, extract
from router.quality import STRONG_MODEL, QualityPredictor
from router.training.gain_regression import fit_gain
from router.training.quality_data import (
    PAIR_MODELS,
    QualityTable,
    data_digest,
    final_split,
    inner_folds,
    load_table,
    outer_folds,
)
from router.training.quality_evaluation import DatasetResult, column_means, judge, sweep
from router.training.quality_report import FoldReport, write_card

FamilyType = Literal["prior", "gain", "heads"]


@dataclass(frozen=True, slots=True)
class Recipe:
    """One candidate: a family and its strength (see the module docstring)."""

    family: FamilyType
    ridge: float = 0.0
    beta: float = 0.0

    def describe(self) -> str:
        if self.family == "gain":
            return f"gain (ridge {self.ridge:g}, beta {self.beta:g})"
        if self.family == "heads":
            return f"heads (ridge {self.ridge:g})"
        return "prior"


# Simplest first: a tie keeps the earlier one.
RECIPES: tuple[Recipe, ...] = (
    Recipe("prior"),
    *(Recipe("gain", ridge, beta) for ridge in (0.1, 1.0, 10.0) for beta in (0.5, 1.0, 2.0)),
    *(Recipe("heads", ridge) for ridge in (100.0, 10.0, 1.0, 0.1)),
)
SELECTION_TARGETS = (0.93, 0.95, 0.97)  # quality levels whose savings choose a recipe
SOFTMAX_STEPS = 300
SOFTMAX_L2 = 1e-3
SOFTMAX_RATE = 0.05
LOGIT_CLIP = 0.02  # table cells are read in logit space within [0.02, 0.98]


@dataclass(frozen=True, eq=False)
class Basis:
    """What every recipe on one training set shares: the rows, their standardised
    features, the task posterior and the (imputed) task x model quality table."""

    rows: IntArray
    mean: FloatArray
    scale: FloatArray
    low: FloatArray
    high: FloatArray
    x: FloatArray
    tasks: tuple[str, ...]
    task_index: IntArray  # each row's task
    task_weights: FloatArray
    posterior: FloatArray
    task_quality: FloatArray


def dense_features(table: QualityTable) -> FloatArray:
    """The dense request features of each row's prompt (a single user message)."""
    return np.vstack([extract([{"role": "user", "content": p}]).dense for p in table.prompts])


def fit_basis(table: QualityTable, rows: IntArray, dense: FloatArray) -> Basis:
    raw = dense[rows]
    mean, scale = raw.mean(axis=0), raw.std(axis=0)
    scale[scale < 1e-9] = 1.0  # constant in training (tools, system prompt): weight 0
    x = (raw - mean) / scale
    tasks_array, task_index = np.unique(np.array(table.datasets)[rows], return_inverse=True)
    tasks = tuple(str(t) for t in tasks_array)
    weights = _dataset_weights(task_index)
    task_weights = _softmax_fit(x, task_index, len(tasks), weights)
    quality = table.quality[rows]
    cells = np.array([_nanmean(quality[task_index == t]) for t in range(len(tasks))])
    return Basis(
        rows=rows,
        mean=mean,
        scale=scale,
        low=raw.min(axis=0),
        high=raw.max(axis=0),
        x=x,
        tasks=tasks,
        task_index=task_index,
        task_weights=task_weights,
        posterior=_softmax(x, task_weights),
        task_quality=_impute(cells),
    )


def fit(table: QualityTable, basis: Basis, recipe: Recipe) -> QualityPredictor:
    """The predictor of `recipe` on the basis's rows (no choice made here)."""
    n_models = len(table.models)
    task_quality, deviation = basis.task_quality, np.zeros((basis.x.shape[1], n_models))
    if recipe.family == "gain":
        coef, sensitivity, offsets = _gain_direction(table, basis, recipe.ridge)
        deviation = recipe.beta * np.outer(coef, sensitivity)
        task_quality = task_quality - recipe.beta * np.outer(offsets, sensitivity)
    elif recipe.family == "heads":
        deviation, intercept = _heads(table, basis, recipe.ridge)
        task_quality = task_quality + intercept[None, :]
    return QualityPredictor(
        models=table.models,
        tasks=basis.tasks,
        dense_mean=basis.mean,
        dense_scale=basis.scale,
        dense_low=basis.low,
        dense_high=basis.high,
        task_weights=basis.task_weights,
        task_quality=task_quality,
        deviation=deviation,
        training={"recipe": recipe.describe()},
    )


def _gain_direction(
    table: QualityTable, basis: Basis, ridge: float
) -> tuple[FloatArray, FloatArray, FloatArray]:
    """The within-task gain regression's weights, each model's sensitivity to its score
    (a within-task regression of the model's residual on it) and each task's mean score
    (subtracted at run time, so the direction moves a prompt within its task only)."""
    quality, cost = table.quality[basis.rows], table.cost[basis.rows]
    strong = table.models.index(STRONG_MODEL)
    cheap = _cheap_pool(quality, cost, basis.task_index, strong)
    with np.errstate(invalid="ignore"):
        pool_mean = np.nanmean(np.where(cheap, quality, np.nan), axis=1)
    gain = quality[:, strong] - pool_mean
    known = ~np.isnan(gain)
    weights = _dataset_weights(basis.task_index)
    columns = basis.x.std(axis=0) > 1e-12
    coef = fit_gain(
        basis.x[known],
        gain[known],
        basis.task_index[known],
        weights[known],
        ridge=ridge,
        columns=columns,
    )
    score = basis.x @ coef
    offsets = np.array([score[basis.task_index == t].mean() for t in range(len(basis.tasks))])
    centred = score - offsets[basis.task_index]
    residual = quality - basis.task_quality[basis.task_index]
    sensitivity = np.zeros(quality.shape[1])
    for model in range(quality.shape[1]):
        answered = ~np.isnan(residual[:, model])
        if answered.sum() < 2:
            continue
        r = _within(residual[answered, model], basis.task_index[answered])
        s, w = centred[answered], weights[answered]
        sensitivity[model] = float((w * s) @ r / max(float((w * s) @ s), 1e-12))
    return coef, sensitivity, offsets


def _heads(table: QualityTable, basis: Basis, ridge: float) -> tuple[FloatArray, FloatArray]:
    """Per model, weighted ridge weights (and intercept) of its residual from the prior
    on the standardised features; the penalty scales with the rows it has."""
    residual = table.quality[basis.rows] - basis.posterior @ basis.task_quality
    weights = _dataset_weights(basis.task_index)
    design = np.hstack([basis.x, np.ones((len(basis.x), 1))])
    coef = np.zeros((basis.x.shape[1], residual.shape[1]))
    intercept = np.zeros(residual.shape[1])
    for model in range(residual.shape[1]):
        answered = ~np.isnan(residual[:, model])
        if not answered.any():
            continue
        a, w = design[answered], weights[answered]
        penalty = ridge * w.sum() * np.eye(a.shape[1])
        penalty[-1, -1] = 0.0  # the intercept is not shrunk
        solution = np.linalg.solve(
            a.T @ (a * w[:, None]) + penalty, a.T @ (w * residual[answered, model])
        )
        coef[:, model], intercept[model] = solution[:-1], solution[-1]
    return coef, intercept


def _cheap_pool(quality: FloatArray, cost: FloatArray, task: IntArray, strong: int) -> FloatArray:
    """Per row, the models that answered it and cost under half the strong model over
    its task (all but the strong one where the task has no costs)."""
    cheap = np.zeros(quality.shape, dtype=bool)
    answered = ~np.isnan(quality)
    for t in np.unique(task):
        rows = task == t
        prices = _nanmean(cost[rows])
        if np.isnan(prices[strong]):
            cheap[rows] = answered[rows]
        else:
            cheap[rows] = answered[rows] & (prices < prices[strong] / 2)[None, :]
        cheap[rows, strong] = False
    return cheap


def choose(
    table: QualityTable, rows: IntArray, dense: FloatArray, recipes: Sequence[Recipe] = RECIPES
) -> Recipe:
    """The recipe with the best selection score on out-of-fold predictions over
    `inner_folds(rows)` (ties: the earlier, simpler one)."""
    predicted = {recipe: np.zeros((len(table), len(table.models))) for recipe in recipes}
    for train, test in inner_folds(table, rows):
        basis = fit_basis(table, train, dense)
        for recipe in recipes:
            predicted[recipe][test] = fit(table, basis, recipe).predict_dense(dense[test])
    scores = [selection_score(table, predicted[r], rows, rows) for r in recipes]
    return recipes[int(np.argmax(scores))]


def selection_score(
    table: QualityTable, predicted: FloatArray, test: IntArray, train: IntArray
) -> float:
    """Mean over the datasets with costs of the saving at each `SELECTION_TARGETS`
    level (not reached: no saving)."""
    strong = table.models.index(STRONG_MODEL)
    values = []
    for rows, seen in _priced(table, test, train):
        mean_cost = column_means(table.cost[seen])
        curve = sweep(predicted[rows], table.quality[rows], table.cost[rows], mean_cost, strong)
        values += [np.nan_to_num(curve.saving_at(target), nan=0.0) for target in SELECTION_TARGETS]
    return float(np.mean(values)) if values else 0.0


def judge_rows(
    table: QualityTable, predicted: FloatArray, test: IntArray, train: IntArray
) -> list[DatasetResult]:
    """`quality_evaluation.judge` on each dataset of `test` whose rows have costs."""
    strong = table.models.index(STRONG_MODEL)
    pair = [table.models.index(m) for m in PAIR_MODELS if m in table.models]
    return [
        judge(
            table.datasets[rows[0]],
            predicted[rows],
            table.quality[rows],
            table.cost[rows],
            table.quality[seen],
            table.cost[seen],
            table.models,
            strong,
            pair,
        )
        for rows, seen in _priced(table, test, train)
    ]


def _priced(
    table: QualityTable, test: IntArray, train: IntArray
) -> list[tuple[IntArray, IntArray]]:
    """(test rows, training rows) of each dataset in `test` whose rows all price the
    strong model's answer and that has training rows, in order of appearance."""
    strong = table.models.index(STRONG_MODEL)
    datasets = np.array(table.datasets)
    pairs = []
    for name in dict.fromkeys(datasets[test].tolist()):
        rows, seen = test[datasets[test] == name], train[datasets[train] == name]
        if len(seen) and not np.isnan(table.cost[rows, strong]).any():
            pairs.append((rows, seen))
    return pairs


def evaluate_split(
    table: QualityTable,
    train: IntArray,
    test: IntArray,
    dense: FloatArray,
    name: str,
    recipes: Sequence[Recipe] = RECIPES,
) -> tuple[QualityPredictor, FoldReport]:
    """Choose a recipe on `train` (inner folds), fit it on all of `train`, judge `test`."""
    recipe = choose(table, train, dense, recipes)
    predictor = fit(table, fit_basis(table, train, dense), recipe)
    predictor = QualityPredictor.from_dict(predictor.to_dict())  # judge what ships: rounded
    predicted = np.zeros((len(table), len(table.models)))
    predicted[test] = predictor.predict_dense(dense[test])
    results = tuple(judge_rows(table, predicted, test, train))
    return predictor, FoldReport(name, recipe.describe(), results)


def cross_validate(
    table: QualityTable, dense: FloatArray, recipes: Sequence[Recipe] = RECIPES
) -> list[FoldReport]:
    """Nested cross-validation over the pool (the final split is not touched)."""
    pool, _ = final_split(table)
    return [
        evaluate_split(table, train, test, dense, f"outer-{i}", recipes)[1]
        for i, (train, test) in enumerate(outer_folds(table, pool))
    ]


def train(
    table: QualityTable, dense: FloatArray, recipes: Sequence[Recipe] = RECIPES
) -> tuple[QualityPredictor, list[FoldReport], FoldReport]:
    """The shipped predictor (recipe chosen on the pool, fitted on it), the nested
    cross-validation reports, and the final split's, judged once."""
    folds = cross_validate(table, dense, recipes)
    pool, final = final_split(table)
    predictor, report = evaluate_split(table, pool, final, dense, "final", recipes)
    return predictor, folds, report


def run(data_dir: Path | None) -> tuple[QualityPredictor, list[FoldReport], FoldReport]:
    """Load the data, run the nested cross-validation and the final split: the shipped
    predictor (its summary filled in) and the reports."""
    table = load_table(data_dir)
    if STRONG_MODEL not in table.models:
        raise RoutingError(f"the routing data has no answers of {STRONG_MODEL}, the reference")
    predictor, folds, final = train(table, dense_features(table))
    training = _summary(table, final.recipe, data_digest(data_dir))
    return QualityPredictor.from_dict({**predictor.to_dict(), "training": training}), folds, final


def write(
    predictor: QualityPredictor, folds: Sequence[FoldReport], final: FoldReport, out: Path
) -> None:
    """The model file and, beside it, its card."""
    predictor.save(out)
    candidates = [recipe.describe() for recipe in RECIPES]
    write_card(predictor, folds, final, candidates, out.with_suffix(".card.md"))


def _summary(table: QualityTable, recipe: str, digest: str) -> dict[str, object]:
    pool, _ = final_split(table)
    datasets = np.array(table.datasets)[pool]
    names, counts = np.unique(datasets, return_counts=True)
    return {
        "recipe": recipe,
        "rows": len(pool),
        "datasets": {str(n): int(c) for n, c in zip(names, counts, strict=True)},
        "data_sha256_12": digest,
    }


def _softmax_fit(x: FloatArray, labels: IntArray, k: int, weights: FloatArray) -> FloatArray:
    """Weighted multinomial logistic regression (bias in the last row), full-batch Adam
    from zero: deterministic."""
    design = np.hstack([x, np.ones((len(x), 1))])
    target = np.eye(k)[labels]
    share = weights / weights.sum()
    decay = np.ones((design.shape[1], 1))
    decay[-1] = 0.0  # the bias is not penalised
    coef = np.zeros((design.shape[1], k))
    first, second = np.zeros_like(coef), np.zeros_like(coef)
    for step in range(1, SOFTMAX_STEPS + 1):
        residual = (_softmax(x, coef) - target) * share[:, None]
        grad = design.T @ residual + SOFTMAX_L2 * coef * decay
        first = 0.9 * first + 0.1 * grad
        second = 0.999 * second + 0.001 * grad * grad
        step_size = SOFTMAX_RATE / (1 - 0.9**step)
        coef -= step_size * first / (np.sqrt(second / (1 - 0.999**step)) + 1e-8)
    return coef


def _softmax(x: FloatArray, coef: FloatArray) -> FloatArray:
    z = x @ coef[:-1] + coef[-1]
    z = np.exp(z - z.max(axis=1, keepdims=True))
    out: FloatArray = z / z.sum(axis=1, keepdims=True)
    return out


def _impute(cells: FloatArray) -> FloatArray:
    """Tasks x models mean qualities with the missing cells (a model never asked on a
    task) filled by an additive fit in logit space, logit q = task + model, on the
    observed cells."""
    clipped = np.clip(cells, LOGIT_CLIP, 1.0 - LOGIT_CLIP)
    logit = np.log(clipped / (1.0 - clipped))
    seen = ~np.isnan(logit)
    model = np.zeros(logit.shape[1])
    for _ in range(100):  # alternating means: converges fast on a table this small
        task = _nanmean((logit - model[None, :]).T)
        model = np.nan_to_num(_nanmean(logit - task[:, None]))
    filled = 1.0 / (1.0 + np.exp(-(task[:, None] + model[None, :])))
    return np.where(seen, cells, filled)


def _nanmean(values: FloatArray) -> FloatArray:
    from router.training.quality_evaluation import column_means

    return column_means(values)


def _within(values: FloatArray, groups: IntArray) -> FloatArray:
    """`values` minus their mean within each group."""
    out = values.copy()
    for group in np.unique(groups):
        out[groups == group] -= values[groups == group].mean()
    return out


def _dataset_weights(task_index: IntArray) -> FloatArray:
    """Each dataset weighs the same in total, so MMLU's 10k rows do not drown the rest."""
    counts = np.bincount(task_index)
    weights: FloatArray = len(task_index) / (len(counts) * counts[task_index])
    return weights
