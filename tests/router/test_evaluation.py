"""Metric checks on 10 prompts: 5 only the strong model gets right, 5 both get right.

With distinct scores the decile thresholds route 100%, 90%, ..., 10% to the strong
model, so the curve spans shares [0.1, 1]; areas below are computed by hand.
"""

from __future__ import annotations

import numpy as np
import pytest

from router.evaluation import apgr, cpt, evaluate, random_metrics, route_curve

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
