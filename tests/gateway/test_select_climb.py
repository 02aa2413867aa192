"""A verified `select` climbs the choice made among the deployments left to try."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gateway.pipeline.proxy import climb
from router.target_selection import Estimate, choose

# "France?" on the review's fleet: mixtral chosen, yi and gpt35 also meet the target.
ESTIMATES = {
    "gpt4": Estimate(0.93, 3e-4),
    "mixtral": Estimate(0.722, 6e-6),
    "yi": Estimate(0.685, 8e-6),
    "gpt35": Estimate(0.666, 1e-5),
    "mistral": Estimate(0.5, 2e-6),
}


def deployments(*names: str) -> list[Any]:
    return [SimpleNamespace(name=name) for name in names]


def names(chain: list[Any]) -> list[str]:
    return [d.name for d in chain]


def test_the_chain_starts_at_the_choice() -> None:
    choice = choose(ESTIMATES, reference_quality=0.93, fraction=0.7)
    assert choice.chosen == "mixtral"
    assert names(climb(choice, deployments(*ESTIMATES))) == ["mixtral", "gpt4"]


def test_an_ejected_choice_gives_way_to_the_next_cheapest_that_meets_the_target() -> None:
    """Not straight to gpt4 at 40x the price of yi, which meets the target too."""
    choice = choose(ESTIMATES, reference_quality=0.93, fraction=0.7)
    left = deployments("gpt4", "yi", "gpt35", "mistral")  # mixtral ejected
    assert names(climb(choice, left))[0] == "yi"
    assert names(climb(choice, left))[-1] == "gpt4"


def test_nothing_known_left_falls_back_to_the_first() -> None:
    choice = choose(ESTIMATES, reference_quality=0.93, fraction=0.7)
    assert names(climb(choice, deployments("other"))) == ["other"]
    assert climb(choice, []) == []


def test_exploring_tries_the_cheapest_near_the_target_or_lowered_by_traffic() -> None:
    choice = choose(ESTIMATES, reference_quality=0.93, fraction=0.8)  # target 0.744
    assert choice.chosen == "gpt4"
    assert choice.explorer() == "mixtral"  # 0.722: within the margin, the cheapest such
    learned_down = {**ESTIMATES, "mistral": Estimate(0.5, 2e-6, prior=0.75)}
    lowered = choose(learned_down, reference_quality=0.93, fraction=0.8)
    assert lowered.explorer() == "mistral"  # its prior met the target: it may recover
    far = choose({**ESTIMATES, "mixtral": Estimate(0.5, 6e-6)}, 0.93, 0.8)
    assert far.explorer() == "yi"  # mixtral is too far under, and traffic did not put it
    assert choose(ESTIMATES, reference_quality=0.93, fraction=0.5).explorer() is None


def test_explore_puts_the_explorer_first_on_its_share_only() -> None:
    from gateway.pipeline.proxy import explored

    choice = choose(ESTIMATES, reference_quality=0.93, fraction=0.8)
    left = deployments(*ESTIMATES)
    chain = climb(choice, left)
    assert names(chain) == ["gpt4"]
    assert names(explored(choice, chain, left, 0.05, roll=lambda: 0.01)) == ["mixtral", "gpt4"]
    assert explored(choice, chain, left, 0.05, roll=lambda: 0.5) == chain
    assert explored(choice, chain, left, 0.0, roll=lambda: 0.0) == chain
