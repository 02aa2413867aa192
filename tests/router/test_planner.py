"""Plans for each strategy: order, skipped deployments, and score-to-tier choice."""

from __future__ import annotations

import pytest

from router import DeploymentView, RouteSpec, RoutingError, Threshold, plan_route

VIEWS = (
    DeploymentView("local-a", "local"),
    DeploymentView("local-b", "local", "api_base is not set (LOCAL_URL unset)"),
    DeploymentView("mid", "mid"),
    DeploymentView("gpt", "premium"),
)
TIERS = (Threshold("local", 0.3), Threshold("mid", 0.7), Threshold("premium"))


def deployments(spec: RouteSpec, score: float | None = None) -> list[str]:
    return [step.deployment for step in plan_route(spec, score).steps]


def test_fallback_keeps_order_and_skips_unavailable() -> None:
    plan = plan_route(RouteSpec("auto", "fallback", VIEWS))
    assert [s.deployment for s in plan.steps] == ["local-a", "mid", "gpt"]
    assert plan.skipped == (("local-b", "api_base is not set (LOCAL_URL unset)"),)
    assert "skip 'local-b': api_base is not set (LOCAL_URL unset)" in plan.reasons()


def test_fixed_takes_the_first() -> None:
    assert deployments(RouteSpec("one", "fixed", VIEWS)) == ["local-a"]


@pytest.mark.parametrize(
    ("score", "expected"),
    [
        (0.0, ["local-a", "mid", "gpt"]),
        (0.29, ["local-a", "mid", "gpt"]),
        (0.3, ["mid", "gpt"]),  # thresholds are exclusive: 0.3 is not below 0.3
        (0.69, ["mid", "gpt"]),
        (0.95, ["gpt"]),
    ],
)
def test_classifier_starts_at_the_scored_tier_and_escalates(
    score: float, expected: list[str]
) -> None:
    spec = RouteSpec("smart", "classifier", VIEWS, TIERS)
    assert deployments(spec, score) == expected


def test_classifier_explains_its_choice() -> None:
    plan = plan_route(RouteSpec("smart", "classifier", VIEWS, TIERS), 0.5)
    assert plan.score == 0.5
    assert "score 0.500 -> tier 'mid' (below 0.7)" in plan.reasons()


def test_classifier_needs_a_score_and_unknown_strategies_fail() -> None:
    with pytest.raises(RoutingError, match="not scored"):
        plan_route(RouteSpec("smart", "classifier", VIEWS, TIERS))
    with pytest.raises(RoutingError, match="known strategies"):
        plan_route(RouteSpec("x", "astrology", VIEWS))
