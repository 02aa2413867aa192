"""Metric checks on 10 prompts: 5 only the strong model gets right, 5 both get right.

With distinct scores the decile thresholds route 100%, 90%, ..., 10% to the strong
model, so the curve spans shares [0.1, 1]; areas below are computed by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from router.training.evaluation import (
    BOOTSTRAP_DRAWS,
    Metrics,
    apgr,
    bootstrap_intervals,
    cpt,
    evaluate,
    random_metrics,
    route_curve,
    route_intervals,
)

WEAK = [False] * 5 + [True] * 5
STRONG = [True] * 10
PERFECT = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2, 0.1]


def test_perfect_router() -> None:
    curve = route_curve(PERFECT, WEAK, STRONG)
    assert curve.share.tolist() == pytest.approx(
        [0.1, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1]
    )
    # quality = 0.5 + min(share, 0.5); area over [0.1, 1] = 0.32 + 0.5 = 0.82
    assert apgr(curve) == pytest.approx((0.82 - 0.45) / 0.45)
    assert cpt(curve, 0.5) == pytest.approx(0.25)
    assert cpt(curve, 0.8) == pytest.approx(0.40)


def test_inverse_router() -> None:
    curve = route_curve(PERFECT[::-1], WEAK, STRONG)
    # quality = 0.5 + max(0, share - 0.5); area = 0.45 + 0.125 = 0.575
    assert apgr(curve) == pytest.approx((0.575 - 0.45) / 0.45)
    assert cpt(curve, 0.5) == pytest.approx(0.75)
    assert cpt(curve, 0.8) == pytest.approx(0.90)


def test_random_router_recovers_half_the_gap() -> None:
    rng = np.random.default_rng(7)
    weak = rng.random(4000) < 0.6
    strong = rng.random(4000) < 0.8
    metrics = random_metrics(weak, strong)
    assert metrics.apgr == pytest.approx(0.5, abs=0.05)
    assert metrics.cpt50 == pytest.approx(0.5, abs=0.06)
    assert metrics.cpt80 == pytest.approx(0.8, abs=0.06)


def test_evaluate_bundles_the_three_metrics() -> None:
    metrics = evaluate(PERFECT, WEAK, STRONG)
    assert (metrics.cpt50, metrics.cpt80) == pytest.approx((0.25, 0.40))


def test_cpt_is_the_smallest_share_when_the_target_is_met_at_once() -> None:
    curve = route_curve(PERFECT, [True] * 10, [True] * 9 + [False])
    assert curve.strong_quality < curve.weak_quality
    assert cpt(curve, 0.5) == pytest.approx(0.1)


def test_bootstrap_intervals_hold_the_figure_and_narrow_with_more_prompts() -> None:
    rng = np.random.default_rng(3)

    def sample(rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        weak = rng.random(rows) < 0.6
        strong = weak | (rng.random(rows) < 0.5)
        scores = rng.random(rows) + (strong & ~weak)  # informative, not perfect
        return scores, weak, strong

    small, large = sample(200), sample(5000)
    figure = evaluate(*small)
    narrow, wide = route_intervals(*large), route_intervals(*small)
    assert wide.apgr[0] <= figure.apgr <= wide.apgr[1]
    assert wide.cpt50[0] <= figure.cpt50 <= wide.cpt50[1]
    assert narrow.apgr[1] - narrow.apgr[0] < wide.apgr[1] - wide.apgr[0]
    assert narrow.cpt50[1] - narrow.cpt50[0] < wide.cpt50[1] - wide.cpt50[0]
    assert route_intervals(*small) == wide  # a fixed seed: a rerun prints the same


def test_bootstrap_intervals_leave_out_undefined_resamples() -> None:
    # Both models alike on every prompt: no gap to recover, APGR undefined everywhere.
    same = [True, False] * 10
    intervals = route_intervals(np.arange(20.0), same, same)
    assert np.isnan(intervals.apgr[0]) and np.isnan(intervals.apgr[1])
    # Defined on some resamples only: the interval is theirs.
    calls: list[int] = []

    def metrics_of(rows: np.ndarray) -> Metrics:
        calls.append(len(rows))
        undefined = len(calls) % 2 == 0
        value = float("nan") if undefined else 0.5 + len(calls) / 1000
        return Metrics(value, value, value)

    intervals = bootstrap_intervals(metrics_of, 7)
    assert set(calls) == {7} and len(calls) == BOOTSTRAP_DRAWS
    assert 0.5 < intervals.apgr[0] < intervals.apgr[1] < 0.5 + BOOTSTRAP_DRAWS / 1000
