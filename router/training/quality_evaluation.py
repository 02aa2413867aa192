"""Judging a quality predictor as a selector: what it saves at a quality target.

Per row, the selector takes the model with the highest predicted quality minus λ times
that model's mean cost (over the dataset's training rows), among the models that
answered the row; λ is swept from 0 up. Each λ gives a point: the chosen answers' mean
quality relative to the strong model's on the same rows, and the saving, one minus their
real per-row cost over the strong model's on every row. The headline is the largest
saving among the points that keep at least 95% of the strong model's quality (NaN when
none does: the selector then loses quality even at λ = 0).

    curve = sweep(predicted, quality, cost, mean_cost, strong)
    curve.saving_at(0.95)

Beside it: the best single model (the cheapest whose quality on the training rows is at
least 95% of the strong model's there, judged on the test rows; and, for scale, the same
chosen on the test rows themselves, "in hindsight"), the random mix (a share
of the rows, drawn at random, to the strong model and the rest to one cheap model, both
chosen on the training rows to keep 95% there: what knowing nothing of the prompt buys),
the Mixtral / GPT-4 pair (the same selector offered those two only) and the oracle (the
selector given the true qualities: the room there is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]
TARGET = 0.95
# λ in units of the strong model's mean cost: 0, then from "quality only" to "cost only".
LAMBDAS = np.concatenate([[0.0], np.geomspace(1e-3, 1e3, 300)])


@dataclass(frozen=True, slots=True)
class Sweep:
    """The selector's points, one per λ: quality relative to the strong model's and the
    saving against calling it on every row."""

    quality: FloatArray
    saving: FloatArray

    def saving_at(self, target: float = TARGET) -> float:
        """The largest saving at a quality of at least `target` (NaN: never reached)."""
        ok = self.quality >= target - 1e-12
        return float(self.saving[ok].max()) if ok.any() else float("nan")


def sweep(
    predicted: FloatArray,
    quality: FloatArray,
    cost: FloatArray,
    mean_cost: FloatArray,
    strong: int,
    allowed: BoolArray | None = None,
) -> Sweep:
    """Sweep λ over `predicted` (rows x models); `quality` and `cost` are the true ones
    (NaN: the model did not answer that row; it is never chosen there). `allowed` limits
    the models offered (all by default)."""
    offered = ~np.isnan(quality) & ~np.isnan(cost) & np.isfinite(mean_cost)[None, :]
    if allowed is not None:
        offered &= allowed[None, :]
    base = np.where(offered, predicted, -np.inf)
    price = np.where(np.isfinite(mean_cost), mean_cost, 0.0) / mean_cost[strong]
    # Every λ at once: (λ, rows) choices.
    chosen = np.argmax(base[None, :, :] - LAMBDAS[:, None, None] * price[None, None, :], axis=2)
    rows = np.arange(len(quality))[None, :]
    q, s = _relative(quality[rows, chosen], cost[rows, chosen], quality, cost, strong)
    return Sweep(q, s)


def best_single(quality: FloatArray, cost: FloatArray, strong: int, target: float = TARGET) -> int:
    """The cheapest model (by mean cost) whose mean quality on these rows is at least
    `target` of the strong model's on the rows it answered; the strong model if none is."""
    best, best_cost = strong, float(np.nanmean(cost[:, strong]))
    for model in range(quality.shape[1]):
        answered = ~np.isnan(quality[:, model]) & ~np.isnan(cost[:, model])
        if answered.mean() < 0.9:  # a model missing on many rows is no single choice
            continue
        reference = quality[answered, strong].mean()  # 0: the strong model never right
        ratio = quality[answered, model].mean() / reference if reference > 0 else np.inf
        price = float(cost[answered, model].mean())
        if ratio >= target and price < best_cost:
            best, best_cost = model, price
    return best


def single_point(
    quality: FloatArray, cost: FloatArray, model: int, strong: int
) -> tuple[float, float]:
    """(quality relative to the strong model's, saving) of sending every row to `model`;
    a row it did not answer goes to the strong model."""
    missing = np.isnan(quality[:, model]) | np.isnan(cost[:, model])
    q = np.where(missing, quality[:, strong], quality[:, model])
    c = np.where(missing, cost[:, strong], cost[:, model])
    ratio, saving = _relative(q, c, quality, cost, strong)
    return float(ratio), float(saving)


def _relative(
    chosen_quality: FloatArray,
    chosen_cost: FloatArray,
    quality: FloatArray,
    cost: FloatArray,
    strong: int,
) -> tuple[FloatArray, FloatArray]:
    """Per row of choices (the last axis: the test rows), the quality relative to the
    strong model's on those rows and the saving against it on every row. Rows where the
    strong model scores 0 throughout make any quality enough."""
    reference_quality = float(quality[:, strong].mean())
    reference_cost = float(cost[:, strong].sum())
    mean = chosen_quality.mean(axis=-1)
    everything = np.where(mean == 0, 1.0, np.inf)  # relative to a strong model never right
    ratio = mean / reference_quality if reference_quality > 0 else everything
    saving = 1.0 - chosen_cost.sum(axis=-1) / reference_cost if reference_cost > 0 else 0.0 * mean
    return np.asarray(ratio, dtype=np.float64), np.asarray(saving, dtype=np.float64)


def best_mix(
    quality: FloatArray, cost: FloatArray, strong: int, target: float = TARGET
) -> tuple[int, float]:
    """(model, share): send a random `share` of the rows to the strong model and the rest
    to `model`, the mix that keeps `target` of the strong model's quality on these rows
    at the largest saving. What a selector that knows nothing of the prompt can do."""
    best, best_share, best_saving = strong, 1.0, 0.0
    for model in range(quality.shape[1]):
        answered = ~np.isnan(quality[:, model]) & ~np.isnan(cost[:, model])
        if model == strong or answered.mean() < 0.9:
            continue
        ratio, saving = single_point(quality, cost, model, strong)
        share = 0.0 if ratio >= target else (target - ratio) / (1.0 - ratio)
        if (1.0 - share) * saving > best_saving:
            best, best_share, best_saving = model, share, (1.0 - share) * saving
    return best, best_share


def mix_point(
    quality: FloatArray, cost: FloatArray, model: int, share: float, strong: int
) -> tuple[float, float]:
    """The expected (quality relative to the strong model's, saving) of a random mix."""
    ratio, saving = single_point(quality, cost, model, strong)
    return share + (1.0 - share) * ratio, (1.0 - share) * saving


@dataclass(frozen=True, slots=True)
class DatasetResult:
    """One dataset's test rows: the selector, the references, and their curves."""

    dataset: str
    rows: int
    predictor: Sweep
    pair: Sweep | None
    oracle: Sweep
    single: str
    single_quality: float
    single_saving: float
    hindsight: str  # the best single model chosen on the test rows themselves ...
    hindsight_quality: float  # ... (the "for scale" figure): its quality
    hindsight_saving: float  # and saving there; no selector can count on it
    mix: str  # the random mix's cheap model, its share of rows to the strong model ...
    mix_share: float
    mix_quality: float  # ... and its expected quality and saving on the test rows
    mix_saving: float
    points: Mapping[str, tuple[float, float]]  # every model alone: (quality, saving)


def judge(
    dataset: str,
    predicted: FloatArray,
    quality: FloatArray,
    cost: FloatArray,
    train_quality: FloatArray,
    train_cost: FloatArray,
    models: Sequence[str],
    strong: int,
    pair: Sequence[int] = (),
) -> DatasetResult:
    """The selector and its references on one dataset's test rows; mean costs and the
    best single model come from its training rows."""
    mean_cost = column_means(train_cost)
    allowed = np.zeros(len(models), dtype=bool)
    allowed[list(pair)] = True
    single = best_single(train_quality, train_cost, strong)
    single_q, single_s = single_point(quality, cost, single, strong)
    hindsight = best_single(quality, cost, strong)
    hindsight_q, hindsight_s = single_point(quality, cost, hindsight, strong)
    mix, share = best_mix(train_quality, train_cost, strong)
    mix_q, mix_s = mix_point(quality, cost, mix, share, strong)
    present = [m for m in range(len(models)) if not np.isnan(quality[:, m]).all()]
    return DatasetResult(
        dataset=dataset,
        rows=len(quality),
        predictor=sweep(predicted, quality, cost, mean_cost, strong),
        pair=sweep(predicted, quality, cost, mean_cost, strong, allowed) if pair else None,
        oracle=sweep(np.nan_to_num(quality), quality, cost, mean_cost, strong),
        single=models[single],
        single_quality=single_q,
        single_saving=single_s,
        hindsight=models[hindsight],
        hindsight_quality=hindsight_q,
        hindsight_saving=hindsight_s,
        mix=models[mix],
        mix_share=share,
        mix_quality=mix_q,
        mix_saving=mix_s,
        points={models[m]: single_point(quality, cost, m, strong) for m in present},
    )


def column_means(values: FloatArray) -> FloatArray:
    """Each column's mean over its non-NaN entries (NaN for an empty column)."""
    counts = (~np.isnan(values)).sum(axis=0)
    sums = np.nansum(values, axis=0)
    means: FloatArray = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return means


def format_saving(value: float) -> str:
    return "not reached" if np.isnan(value) else f"{value:.1%}"


def mean_sd(values: Sequence[float]) -> str:
    """`mean ± sd` of per-fold savings, a fold that never reached the target counting
    as no saving (it would send every row to the strong model), and how many did not."""
    array = np.array(values, dtype=np.float64)
    missed = int(np.isnan(array).sum())
    array = np.nan_to_num(array, nan=0.0)
    text = f"{array.mean():.1%} ± {array.std():.1%}"
    return f"{text} ({missed} not reached)" if missed else text


def plot_result(result: DatasetResult, title: str, path: Path) -> None:
    """A PNG of quality (relative to the strong model) against cost (relative to
    calling it on every row): the selector's sweep, the pair's, the oracle's, and each
    model alone as a point."""
    import matplotlib  # imported here: only `router eval-quality --plot` draws

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6.5, 4.8))
    curves = {"quality predictor": result.predictor, "oracle": result.oracle}
    if result.pair is not None:
        curves["Mixtral / GPT-4 pair"] = result.pair
    for label, curve in curves.items():
        order = np.argsort(1.0 - curve.saving)
        cost = (1.0 - curve.saving[order]) * 100
        axes.plot(cost, curve.quality[order] * 100, marker=".", markersize=3, label=label)
    for name, (quality, saving) in result.points.items():
        axes.scatter([(1.0 - saving) * 100], [quality * 100], s=14, color="grey")
        axes.annotate(name.split("/")[-1], ((1.0 - saving) * 100, quality * 100), fontsize=6)
    axes.axhline(TARGET * 100, color="black", linestyle=":", label=f"{TARGET:.0%} of GPT-4")
    axes.set_xscale("log")
    axes.set(
        title=title,
        xlabel="cost (% of GPT-4 on every row)",
        ylabel="quality (% of GPT-4's)",
    )
    axes.legend(loc="lower right", fontsize=7)
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)
