"""Turn a route and what is known about its deployments into an ordered plan.

Pure logic, no I/O: the gateway executes the plan (retries, fallback) and the
`policy explain` command prints it. Strategies are functions in a name table;
the classifier and cascade strategies join it with the router issue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from router.errors import RoutingError


@dataclass(frozen=True, slots=True)
class DeploymentView:
    """What the router knows of one deployment."""

    name: str
    tier: str
    unavailable_reason: str | None = None

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None


@dataclass(frozen=True, slots=True)
class Step:
    deployment: str
    tier: str


@dataclass(frozen=True, slots=True)
class Plan:
    """Deployments to try in order; `skipped` says why others were left out."""

    route: str
    strategy: str
    steps: tuple[Step, ...]
    skipped: tuple[tuple[str, str], ...] = ()

    def reasons(self) -> list[str]:
        lines = [f"route '{self.route}' uses strategy '{self.strategy}'"]
        lines += [f"try '{s.deployment}' (tier {s.tier})" for s in self.steps]
        lines += [f"skip '{name}': {why}" for name, why in self.skipped]
        return lines


StrategyType = Callable[[str, Sequence[DeploymentView]], Plan]


def _available_in_order(route: str, strategy: str, views: Sequence[DeploymentView]) -> Plan:
    steps = tuple(Step(v.name, v.tier) for v in views if v.available)
    skipped = tuple((v.name, v.unavailable_reason or "") for v in views if not v.available)
    return Plan(route, strategy, steps, skipped)


def plan_fixed(route: str, views: Sequence[DeploymentView]) -> Plan:
    return _available_in_order(route, "fixed", views[:1])


def plan_fallback(route: str, views: Sequence[DeploymentView]) -> Plan:
    return _available_in_order(route, "fallback", views)


STRATEGIES: Mapping[str, StrategyType] = {"fixed": plan_fixed, "fallback": plan_fallback}


def plan_route(route: str, strategy: str, views: Sequence[DeploymentView]) -> Plan:
    try:
        planner = STRATEGIES[strategy]
    except KeyError:
        known = ", ".join(sorted(STRATEGIES))
        raise RoutingError(
            f"route '{route}' has strategy '{strategy}'; known strategies: {known}"
        ) from None
    return planner(route, views)
