"""Thresholds that split a sample into target tier shares."""

from __future__ import annotations

import math

import pytest

from router.errors import RoutingError
from router.planner import Threshold, choose_tier
from router.training.calibration import (
    VerifyCut,
    calibrate,
    tiers_yaml,
    verify_cut,
    verify_threshold,
    verify_yaml,
)


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


def test_tied_scores_escalate_the_nearest_share_a_threshold_can_give() -> None:
    """A threshold cannot split tied scores: of 0%, 66.7% and 100%, 66.7% is nearest 50%
    and 40%; the threshold just above the tie escalates both."""
    tied = [0.011, 0.011, 0.998]
    assert verify_cut(tied, 0.5) == verify_cut(tied, 0.4) == VerifyCut(0.0111, 2, 3)
    assert verify_cut(tied, 0.2) == VerifyCut(0.011, 0, 3)
    assert verify_cut(tied, 0.9) == VerifyCut(1.0, 3, 3)
    assert verify_threshold(tied, 0.5) == 0.0111


def test_of_two_shares_as_near_the_larger_is_escalated() -> None:
    assert verify_cut([0.3, 0.3, 0.7, 0.7], 0.25) == VerifyCut(0.3001, 2, 4)
    assert verify_cut([0.3, 0.3, 0.7, 0.7], 0.75) == VerifyCut(1.0, 4, 4)


def test_a_score_of_one_passes_every_threshold_a_policy_takes() -> None:
    """`verify_threshold` is at most 1: an answer scoring 1 is never escalated."""
    assert verify_cut([0.1, 1.0], 1.0) == VerifyCut(0.1001, 1, 2)


def test_a_threshold_has_the_digits_that_keep_the_next_score_above_it() -> None:
    assert verify_cut([0.12341, 0.12342], 0.5) == VerifyCut(0.12342, 1, 2)
    cut = verify_cut([0.00001, 0.000011, 0.5], 0.3)
    assert cut == VerifyCut(0.000011, 1, 3)
    assert verify_yaml(cut) == "verify_threshold: 0.000011  # escalates 33.3% of 3 answers"


@pytest.mark.parametrize("bad", [math.nan, -0.1, 1.5])
def test_verifier_scores_are_shares(bad: float) -> None:
    with pytest.raises(RoutingError, match=r"verifier scores are in \[0, 1\]"):
        verify_cut([0.5, bad], 0.5)


def test_a_tier_with_the_whole_share_takes_every_score_and_one_with_none_none() -> None:
    """Scores below `below` go to a tier: a tier whose later tiers have share 0 takes
    every score (below 1, the highest a policy takes), one with share 0 takes none, even
    where rounding `below` to 4 decimals would have caught the lowest score."""
    scores = [0.12345678, 0.5, 0.99999]

    def counts(shares: dict[str, float]) -> dict[str, int]:
        tiers = calibrate(scores, shares)
        chosen = [choose_tier(tiers, score).tier for score in scores]
        return {name: chosen.count(name) for name in shares}

    assert counts({"local": 1, "premium": 0}) == {"local": 3, "premium": 0}
    assert counts({"local": 0, "premium": 1}) == {"local": 0, "premium": 3}
    assert counts({"a": 0, "b": 0, "c": 1}) == {"a": 0, "b": 0, "c": 3}
    assert counts({"a": 0.5, "b": 0.5, "c": 0}) == {"a": 1, "b": 2, "c": 0}
    assert calibrate(scores, {"local": 1, "premium": 0})[0].below == 1.0
    assert calibrate(scores, {"local": 0, "premium": 1})[0].below == 0.1234


@pytest.mark.parametrize(
    "shares",
    [
        {"a": math.nan, "b": 1},
        {"a": math.inf, "b": 0},
        {"a": 0, "b": 0},
        {"": 0.5, "b": 0.5},
        {" ": 1},
        {},
    ],
)
def test_shares_are_finite_named_and_sum_above_zero(shares: dict[str, float]) -> None:
    with pytest.raises(RoutingError):
        calibrate([0.1, 0.2], shares)


def test_shares_are_scaled_to_sum_to_one() -> None:
    """Shares rounded to two decimals, or given as percentages, mean their proportions."""
    scores = [i / 1000 for i in range(1001)]
    tiers = calibrate(scores, {"a": 0.33, "b": 0.33, "c": 0.33})
    assert [t.below for t in tiers] == [0.3333, 0.6667, None]
    assert calibrate(scores, {"a": 70, "b": 30}) == calibrate(scores, {"a": 0.7, "b": 0.3})
