"""Router quality metrics, computed as RouteLLM's `evaluate.py` does.

For scores s (higher = send to the strong model), the thresholds are the 11 deciles of
s; at threshold t a request goes to the strong model when s >= t. Each threshold gives
a point (strong-call share, quality), quality being the mean of the routed model's
correctness. Then:

- APGR = (AUC - weak AUC) / (strong AUC - weak AUC), trapezoid areas over the curve's
  strong-share range (weak and strong AUC are the constant qualities over that range,
  so over [0, 1] this is (AUC - weak) / (strong - weak));
- CPT(p) = the strong-call share at which quality first reaches
  weak + p * (strong - weak), interpolated linearly along the curve.

    metrics = evaluate(scores, weak_correct, strong_correct)

The cascade (cheap model first, a verifier scores its answer, escalate below a
threshold) gets the same curve: thresholds at the 11 deciles of the verifier scores,
x = escalation share (rows scoring strictly below the threshold, which take the strong
model's correctness), and a cost per point: the cheap call on every row plus the strong
call on escalated rows, relative to always calling the strong model.

    cascade = cascade_curve(verifier_scores, weak_correct, strong_correct, weak_cost, strong_cost)

A few hundred labelled prompts say little about small differences, so each figure can
come with a bootstrap interval: the prompts resampled with replacement
(``BOOTSTRAP_DRAWS`` times, a fixed seed), the metric recomputed on each resample.

    intervals = route_intervals(scores, weak_correct, strong_correct)  # APGR, CPT(50%)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
DECILES = np.linspace(0.0, 1.0, 11)
RANDOM_SEEDS = 10
BOOTSTRAP_DRAWS = 200
CONFIDENCE = 0.90  # the central share of the resampled metrics an interval spans


@dataclass(frozen=True, slots=True)
class Curve:
    """Quality against strong-call share, sorted by share (ascending)."""

    share: FloatArray
    quality: FloatArray
    weak_quality: float
    strong_quality: float


@dataclass(frozen=True, slots=True)
class Metrics:
    apgr: float
    cpt50: float
    cpt80: float


def route_curve(
    scores: npt.ArrayLike,
    weak_correct: npt.ArrayLike,
    strong_correct: npt.ArrayLike,
) -> Curve:
    """The 11-point quality curve of a router's scores on labelled prompts."""
    s = np.asarray(scores, dtype=np.float64)
    weak = np.asarray(weak_correct, dtype=np.float64)
    strong = np.asarray(strong_correct, dtype=np.float64)
    points = []
    for threshold in np.quantile(s, DECILES):
        to_strong = s >= threshold
        points.append((to_strong.mean(), np.where(to_strong, strong, weak).mean()))
    points.sort()
    share, quality = (np.array(column) for column in zip(*points, strict=True))
    return Curve(share, quality, float(weak.mean()), float(strong.mean()))


@dataclass(frozen=True, slots=True)
class CascadeCurve:
    """A cascade's quality curve (x = escalation share) and its cost at each point."""

    curve: Curve
    cost: FloatArray  # mean cost per query relative to always-strong, aligned with curve.share


def cascade_curve(
    verifier_scores: npt.ArrayLike,
    weak_correct: npt.ArrayLike,
    strong_correct: npt.ArrayLike,
    weak_cost: npt.ArrayLike,
    strong_cost: npt.ArrayLike,
) -> CascadeCurve:
    """The 11-point curve of a verifier cascade; costs are per row (any unit, same for both)."""
    s = np.asarray(verifier_scores, dtype=np.float64)
    weak = np.asarray(weak_correct, dtype=np.float64)
    strong = np.asarray(strong_correct, dtype=np.float64)
    cheap = np.asarray(weak_cost, dtype=np.float64)
    dear = np.asarray(strong_cost, dtype=np.float64)
    always_strong = dear.sum()
    points = []
    for threshold in np.quantile(s, DECILES):
        escalate = s < threshold
        quality = np.where(escalate, strong, weak).mean()
        cost = (cheap.sum() + dear[escalate].sum()) / always_strong
        points.append((escalate.mean(), quality, cost))
    points.sort()
    share, quality, cost = (np.array(column) for column in zip(*points, strict=True))
    return CascadeCurve(Curve(share, quality, float(weak.mean()), float(strong.mean())), cost)


def apgr(curve: Curve) -> float:
    """Average performance gap recovered."""
    width = curve.share[-1] - curve.share[0]
    gap = (curve.strong_quality - curve.weak_quality) * width
    if gap == 0.0:  # the two models score alike (or one point): nothing to recover
        return float("nan")
    return float((_trapezoid(curve.quality, curve.share) - curve.weak_quality * width) / gap)


def cpt(curve: Curve, fraction: float) -> float:
    """Strong-call share needed to recover `fraction` of the weak-to-strong gap."""
    target = curve.weak_quality + fraction * (curve.strong_quality - curve.weak_quality)
    x, y = curve.share, curve.quality
    if y[0] >= target:
        return float(x[0])
    for i in range(1, len(x)):
        if y[i] >= target:
            rise = y[i] - y[i - 1]
            return float(x[i - 1] + (target - y[i - 1]) / rise * (x[i] - x[i - 1]))
    return float("nan")


def evaluate(
    scores: npt.ArrayLike,
    weak_correct: npt.ArrayLike,
    strong_correct: npt.ArrayLike,
) -> Metrics:
    curve = route_curve(scores, weak_correct, strong_correct)
    return Metrics(apgr(curve), cpt(curve, 0.5), cpt(curve, 0.8))


@dataclass(frozen=True, slots=True)
class Intervals:
    """Bootstrap intervals (low, high) of APGR and CPT(50%)."""

    apgr: tuple[float, float]
    cpt50: tuple[float, float]


def bootstrap_intervals(metrics_of: Callable[[IntArray], Metrics], rows: int) -> Intervals:
    """The central ``CONFIDENCE`` intervals of ``metrics_of(indices)`` over
    ``BOOTSTRAP_DRAWS`` resamples of ``rows`` row indices with replacement (seed 0, so a
    rerun prints the same). Resamples where a metric is undefined (no gap between the
    models to recover) are left out of that metric's interval."""
    rng = np.random.default_rng(0)
    runs = [metrics_of(rng.integers(0, rows, size=rows)) for _ in range(BOOTSTRAP_DRAWS)]
    return Intervals(_central([m.apgr for m in runs]), _central([m.cpt50 for m in runs]))


def route_intervals(
    scores: npt.ArrayLike, weak_correct: npt.ArrayLike, strong_correct: npt.ArrayLike
) -> Intervals:
    """``bootstrap_intervals`` of a router's ``evaluate``."""
    s, weak, strong = (
        np.asarray(a, dtype=np.float64) for a in (scores, weak_correct, strong_correct)
    )
    return bootstrap_intervals(lambda i: evaluate(s[i], weak[i], strong[i]), len(s))


def _central(values: Sequence[float]) -> tuple[float, float]:
    known = np.array([v for v in values if not np.isnan(v)], dtype=np.float64)
    if not known.size:
        return float("nan"), float("nan")
    tail = (1.0 - CONFIDENCE) / 2.0
    low, high = np.quantile(known, [tail, 1.0 - tail])
    return float(low), float(high)


def random_metrics(weak_correct: npt.ArrayLike, strong_correct: npt.ArrayLike) -> Metrics:
    """A random router, averaged over `RANDOM_SEEDS` fixed seeds (expect 0.5 / 50%)."""
    rng = np.random.default_rng(0)
    size = np.asarray(weak_correct).shape[0]
    runs = [evaluate(rng.random(size), weak_correct, strong_correct) for _ in range(RANDOM_SEEDS)]
    return Metrics(
        float(np.mean([m.apgr for m in runs])),
        float(np.mean([m.cpt50 for m in runs])),
        float(np.mean([m.cpt80 for m in runs])),
    )


def random_curve(weak_correct: npt.ArrayLike, strong_correct: npt.ArrayLike) -> Curve:
    rng = np.random.default_rng(0)
    return route_curve(rng.random(np.asarray(weak_correct).shape[0]), weak_correct, strong_correct)


def length_scores(prompts: Sequence[str]) -> FloatArray:
    """The prompt-length baseline: longer prompts go to the strong model first."""
    return np.array([len(p) for p in prompts], dtype=np.float64)


def _trapezoid(y: FloatArray, x: FloatArray) -> float:
    return float(np.sum((x[1:] - x[:-1]) * (y[1:] + y[:-1]) / 2.0))


def plot_curves(
    curves: Mapping[str, Curve],
    title: str,
    path: Path,
    cascades: Mapping[str, Curve] | None = None,
) -> None:
    """Write a PNG of quality vs strong-call share, one line per router.

    `cascades` (label -> curve), when given, are drawn too, dash-dotted (x = escalation
    share); a cascade may cover other rows than the routers, so its own weak / strong
    levels can differ slightly from the reference lines.
    """
    import matplotlib  # imported here: only `router eval` draws

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6, 4.5))
    for name, curve in curves.items():
        axes.plot(curve.share * 100, curve.quality * 100, marker="o", markersize=3, label=name)
    for label, cascade in (cascades or {}).items():
        axes.plot(
            cascade.share * 100,
            cascade.quality * 100,
            marker="s",
            markersize=3,
            linestyle="-.",
            label=label,
        )
    first = next(iter(curves.values()))
    axes.axhline(first.weak_quality * 100, color="grey", linestyle=":", label="weak model")
    axes.axhline(first.strong_quality * 100, color="black", linestyle="--", label="strong model")
    axes.set(title=title, xlabel="strong-call / escalation share (%)", ylabel="quality (% correct)")
    axes.legend(loc="lower right")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    pyplot.close(figure)


INTERVAL_HEADERS = "APGR 90% CI | CPT(50%) 90% CI"


def format_intervals(intervals: Intervals | None) -> str:
    """The two interval cells of a table row (both empty when there are none)."""
    if intervals is None:
        return " | "
    (a, b), (c, d) = intervals.apgr, intervals.cpt50
    return f"{a:.3f}-{b:.3f} | {c:.1%}-{d:.1%}"
