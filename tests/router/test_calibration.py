"""Thresholds that split a sample into target tier shares."""

from __future__ import annotations

import pytest

from router.calibration import calibrate, tiers_yaml, verify_threshold
from router.errors import RoutingError
from router.planner import Threshold, choose_tier


def test_shares_of_a_uniform_sample() -> None:
    scores = [i / 1000 for i in range(1000)]
    tiers = calibrate(scores, {"local": 0.6, "mid": 0.3, "premium": 0.1})
    assert [t.tier for t in tiers] == ["local", "mid", "premium"]
    assert tiers[0].below == pytest.approx(0.6, abs=0.01)
    assert tiers[1].below == pytest.approx(0.9, abs=0.01)
    assert tiers[2].below is None
    counts = {name: 0 for name in ("local", "mid", "premium")}
    for score in scores:
        counts[choose_tier(tiers, score).tier] += 1
    assert counts == pytest.approx({"local": 600, "mid": 300, "premium": 100}, abs=5)


def test_yaml_block_and_bad_input() -> None:
    block = tiers_yaml([Threshold("local", 0.42), Threshold("premium")])
    assert block == "tiers:\n  - {tier: local, below: 0.42}\n  - {tier: premium}\n"
    with pytest.raises(RoutingError):
        calibrate([], {"a": 1})
    with pytest.raises(RoutingError):
        calibrate([0.1], {"a": -1, "b": 1})


def test_verify_threshold_escalates_the_target_share() -> None:
    scores = [i / 100 for i in range(100)]
    threshold = verify_threshold(scores, 0.2)
    assert sum(s < threshold for s in scores) == 20
    assert verify_threshold(scores, 0.0) == 0.0  # nothing scores below the lowest
    assert verify_threshold(scores, 1.0) == 1.0  # everything escalates
    with pytest.raises(RoutingError, match="--escalate must be a share"):
        verify_threshold(scores, 1.5)
    with pytest.raises(RoutingError, match="at least one scored answer"):
        verify_threshold([], 0.2)


def test_the_verify_threshold_is_rounded_down_so_the_quantile_is_kept() -> None:
    """Rounding up would pass the answer at the quantile itself to escalation."""
    assert verify_threshold([0.123456], 0.2) == 0.1234
    scores = [0.123456, 0.9]
    threshold = verify_threshold(scores, 0.0)
    assert sum(s < threshold for s in scores) == 0
