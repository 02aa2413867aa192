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
