"""The `select` strategy's choice: the cheapest candidate meeting the target first, the
others meeting it by cost, the rest best first; a verified climb to ever better ones;
a price prior that never flatters; and the planner's skips."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from router import DeploymentView, RouteSpec, plan_route
from router.errors import RoutingError
from router.target_selection import (
    FLOOR_PROFILE,
    PROFILE_PRICES,
    Estimate,
    choose,
    prior_profile,
)

FLEET = {
    "tiny": Estimate(0.40, 0.0001),
    "mid": Estimate(0.70, 0.0010),
    "big": Estimate(0.80, 0.0100),
    "odd": Estimate(0.75, 0.0005),
}


def test_the_cheapest_that_meets_the_target_comes_first() -> None:
    choice = choose(FLEET, reference_quality=0.80, fraction=0.9)  # target 0.72
    assert choice.target == pytest.approx(0.72)
    assert choice.order == ("odd", "big", "mid", "tiny")  # meeting by cost, then best first
    assert choice.chosen == "odd" and choice.meets("big") and not choice.meets("mid")
    assert choice.chain() == ("odd", "big")
    reasons = choice.reasons()
    assert "cheapest that meets the target" in reasons[1] and "'odd'" in reasons[1]
    assert "below the target" in reasons[-1]


def test_when_none_meets_the_target_the_best_is_asked() -> None:
    choice = choose(FLEET, reference_quality=1.0, fraction=0.95)
    assert choice.chosen == "big" and not choice.meets("big")
    assert "none meets the target" in choice.reasons()[1]


def test_a_low_target_takes_the_cheapest_and_its_chain_climbs() -> None:
    choice = choose(FLEET, reference_quality=0.8, fraction=0.1)
    assert choice.chosen == "tiny"
    assert choice.chain() == ("tiny", "odd", "big")  # mid (0.70 < 0.75) is no better


def test_among_rechooses_over_those_left() -> None:
    choice = choose(FLEET, reference_quality=0.80, fraction=0.9).among({"big", "mid"})
    assert choice.order == ("big", "mid") and choice.target == pytest.approx(0.72)


estimates = st.dictionaries(
    st.text("abcdefgh", min_size=1, max_size=3),
    st.builds(
        Estimate,
        st.floats(0, 1, allow_nan=False),
        st.floats(0, 1, allow_nan=False),
    ),
    min_size=1,
    max_size=8,
)


@given(estimates, st.floats(0, 1, allow_nan=False), st.floats(0.01, 1, allow_nan=False))
def test_choice_rules_hold_for_any_fleet(
    fleet: dict[str, Estimate], reference: float, fraction: float
) -> None:
    choice = choose(fleet, reference, fraction)
    assert sorted(choice.order) == sorted(fleet)  # every candidate, once
    meeting = [n for n in choice.order if choice.meets(n)]
    assert list(choice.order[: len(meeting)]) == meeting  # meeting ones first
    costs = [fleet[n].cost_usd for n in meeting]
    assert costs == sorted(costs)
    rest = [fleet[n].quality for n in choice.order[len(meeting) :]]
    assert rest == sorted(rest, reverse=True)
    chain = choice.chain()
    assert chain[0] == choice.chosen and len(set(chain)) == len(chain)
    qualities = [fleet[n].quality for n in chain]
    assert all(a < b for a, b in itertools.pairwise(qualities))


def test_the_price_prior_is_the_dearest_known_model_that_costs_no_more() -> None:
    assert prior_profile(10.0, 30.0) == "gpt-4-1106-preview"
    assert prior_profile(1.0, 2.0) == "gpt-3.5-turbo-1106"  # 1.5 blended: not gpt-3.5-0613 (1.75)
    assert prior_profile(0.6, 0.6) == "mistralai/mixtral-8x7b-chat"
    assert prior_profile(0.0, 0.0) == FLOOR_PROFILE  # cheaper than any known model
    assert prior_profile(1000.0, 1000.0) == "gpt-4-0314"  # the dearest known
    assert FLOOR_PROFILE in PROFILE_PRICES


def views(*names: str, down: str | None = None) -> list[DeploymentView]:
    return [DeploymentView(n, "t", "no key" if n == down else None) for n in names]


def test_the_planner_orders_by_the_choice_and_skips_what_cannot_serve() -> None:
    choice = choose(FLEET, reference_quality=0.80, fraction=0.9)
    spec = RouteSpec("r", "select", views("tiny", "mid", "big", "odd", down="odd"), choice=choice)
    plan = plan_route(spec)
    assert [s.deployment for s in plan.steps] == ["big", "mid", "tiny"]
    assert plan.skipped == (("odd", "no key"),)
    assert plan.choice is not None and plan.choice.chosen == "big"
    assert any("candidate 'big'" in line for line in plan.reasons())


def test_the_planner_needs_a_choice() -> None:
    with pytest.raises(RoutingError, match="nothing was predicted"):
        plan_route(RouteSpec("r", "select", views("a")))


def test_a_cheap_model_learned_over_the_rest_still_climbs_to_the_strongest() -> None:
    """A learned offset lifted 'cheap' over every other candidate: nothing is predicted
    better, but its rejected answer goes on to the predictor's best, not to the client
    (a review found such refusals delivered with no escalation)."""
    fleet = {
        "cheap": Estimate(0.98, 0.0001, prior=0.73),
        "mid": Estimate(0.72, 0.0010, prior=0.72),
        "big": Estimate(0.80, 0.0100, prior=0.80),
    }
    assert choose(fleet, reference_quality=0.80, fraction=0.95).chain() == ("cheap", "big")
    # The reference is the last resort, whatever the rest: here after the strongest.
    choice = choose(fleet, reference_quality=0.0, fraction=0.95, reference="mid")
    assert choice.chain() == ("cheap", "big", "mid")
    assert choice.among({"cheap", "mid"}).chain() == ("cheap", "mid")  # big ejected
    assert choice.among({"cheap"}).chain() == ("cheap",)  # nobody left to ask


def test_the_reference_candidate_always_meets_its_own_target() -> None:
    """Its estimate, learned offset and all, is the reference quality: the figure the
    caller passes is for a reference that is no candidate."""
    lowered = {**FLEET, "big": Estimate(0.55, 0.0100, prior=0.80)}
    choice = choose(lowered, reference_quality=0.80, fraction=1.0, reference="big")
    assert choice.target == pytest.approx(0.55) and choice.meets("big")
    assert choice.chosen == "odd"  # 0.75: no longer held to the unlearned 0.80
    assert "reference 'big'" in choice.reasons()[0]
    absent = choose(FLEET, reference_quality=0.9, fraction=1.0, reference="elsewhere")
    assert absent.target == pytest.approx(0.9) and absent.reference is None


def test_a_newcomer_lowered_by_one_verdict_stays_on_the_explore_share() -> None:
    """Its prior was within the margin under the target; one rejected answer took its
    learned quality past it. Offsets move only on verdicts: dropped from exploring, it
    could never earn its place back."""
    fleet = {"new": Estimate(0.65, 0.0001, prior=0.65), "big": Estimate(0.80, 0.0100)}
    choice = choose(fleet, reference_quality=0.80, fraction=0.9)  # target 0.72
    assert choice.explorer() == "new"  # 0.07 under the target
    after_a_rejection = {**fleet, "new": Estimate(0.585, 0.0001, prior=0.65)}
    assert choose(after_a_rejection, 0.80, 0.9).explorer() == "new"
    at_the_bound = {**fleet, "new": Estimate(0.40, 0.0001, prior=0.65)}
    assert choose(at_the_bound, 0.80, 0.9).explorer() == "new"
    raised = {**fleet, "new": Estimate(0.64, 0.0001, prior=0.55)}  # traffic put it near
    assert choose(raised, 0.80, 0.9).explorer() == "new"
    too_far = {**fleet, "new": Estimate(0.60, 0.0001, prior=0.60)}  # 0.12 under, both ways
    assert choose(too_far, 0.80, 0.9).explorer() is None


learned = st.builds(
    Estimate,
    st.floats(0, 1, allow_nan=False),
    st.floats(0, 1, allow_nan=False),
    st.floats(0, 1, allow_nan=False),
)


@given(
    st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3), learned, min_size=1, max_size=8),
    st.floats(0.01, 1, allow_nan=False),
    st.data(),
)
def test_a_rejected_answer_always_has_somewhere_to_climb(
    fleet: dict[str, Estimate], fraction: float, data: st.DataObject
) -> None:
    """Whatever the learned offsets: the chain reaches the predictor's strongest and
    then the reference, and the reference meets its own target."""
    reference = data.draw(st.sampled_from(sorted(fleet)))
    choice = choose(fleet, 0.5, fraction, reference=reference)
    chain = choice.chain()
    assert chain[0] == choice.chosen and len(set(chain)) == len(chain)
    assert choice.strongest() in chain and reference in chain and choice.meets(reference)
