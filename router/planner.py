"""Turn a route and what is known about its deployments into an ordered plan.

Pure logic, no I/O: the gateway executes the plan (retries, fallback) and the
`policy explain` command prints it. Strategies are functions in a name table.
Whatever the strategy, a deployment that does not serve what the request needs (its
capabilities: tools, vision, embeddings, ...) is skipped, and the plan says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from router.errors import RoutingError
from router.target_selection import Choice


@dataclass(frozen=True, slots=True)
class DeploymentView:
    """What the router knows of one deployment."""

    name: str
    tier: str
    unavailable_reason: str | None = None
    capabilities: frozenset[str] | None = None  # None: serves whatever is asked

    @property
    def available(self) -> bool:
        return self.unavailable_reason is None

    def lacks(self, needs: frozenset[str]) -> list[str]:
        """What of `needs` it does not serve, sorted."""
        return [] if self.capabilities is None else sorted(needs - self.capabilities)

    def skip_reason(self, needs: frozenset[str]) -> str | None:
        """Why a request needing `needs` cannot go to it, or None."""
        if missing := self.lacks(needs):
            return f"does not serve {', '.join(missing)}"
        return self.unavailable_reason


@dataclass(frozen=True, slots=True)
class Threshold:
    """Scores below `below` go to `tier`; None takes the rest (the last step)."""

    tier: str
    below: float | None = None


@dataclass(frozen=True, slots=True)
class RouteSpec:
    """The routing part of a route: strategy, deployments in order, tier thresholds."""

    name: str
    strategy: str
    deployments: Sequence[DeploymentView]
    tiers: Sequence[Threshold] = ()
    needs: frozenset[str] = frozenset()  # capabilities the request needs
    choice: Choice | None = None  # `select`: every candidate's quality and cost


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
    score: float | None = None
    notes: tuple[str, ...] = field(default=())
    needs: frozenset[str] = frozenset()
    choice: Choice | None = None  # `select`: the choice among the steps

    def reasons(self) -> list[str]:
        lines = [f"route '{self.route}' uses strategy '{self.strategy}'"]
        if self.needs:
            lines.append(f"the request needs {', '.join(sorted(self.needs))}")
        lines += self.notes
        lines += [f"try '{s.deployment}' (tier {s.tier})" for s in self.steps]
        lines += [f"skip '{name}': {why}" for name, why in self.skipped]
        return lines


StrategyType = Callable[[RouteSpec, float | None], Plan]


def _available_in_order(
    spec: RouteSpec,
    views: Sequence[DeploymentView],
    score: float | None = None,
    notes: tuple[str, ...] = (),
) -> Plan:
    why = {v.name: v.skip_reason(spec.needs) for v in views}
    steps = tuple(Step(v.name, v.tier) for v in views if why[v.name] is None)
    skipped = tuple((v.name, reason) for v in views if (reason := why[v.name]) is not None)
    return Plan(spec.name, spec.strategy, steps, skipped, score, notes, spec.needs)


def plan_fixed(spec: RouteSpec, score: float | None) -> Plan:
    return _available_in_order(spec, spec.deployments[:1])


def plan_fallback(spec: RouteSpec, score: float | None) -> Plan:
    return _available_in_order(spec, spec.deployments)


def plan_classifier(spec: RouteSpec, score: float | None) -> Plan:
    """The tier the score falls in first, then the tiers above it (a failed cheap
    deployment escalates, never the other way round); tiers below are left out."""
    if score is None:
        raise RoutingError(f"route '{spec.name}' routes by score but the request was not scored")
    chosen = choose_tier(spec.tiers, score)
    order = [t.tier for t in spec.tiers]
    rank = {tier: i for i, tier in enumerate(order)}
    start = rank[chosen.tier]
    views = sorted(
        (v for v in spec.deployments if rank.get(v.tier, -1) >= start),
        key=lambda v: rank[v.tier],
    )
    bound = f"below {chosen.below:g}" if chosen.below is not None else "the rest"
    note = f"score {score:.3f} -> tier '{chosen.tier}' ({bound})"
    return _available_in_order(spec, views, score=score, notes=(note,))


def choose_tier(tiers: Sequence[Threshold], score: float) -> Threshold:
    for step in tiers:
        if step.below is None or score < step.below:
            return step
    return tiers[-1]


def plan_cascade(spec: RouteSpec, score: float | None) -> Plan:
    """The deployments in the order listed (cheapest tier first); the gateway asks one
    tier at a time and escalates while the verifier rejects the answer."""
    usable = (v for v in spec.deployments if v.skip_reason(spec.needs) is None)
    tiers = list(dict.fromkeys(v.tier for v in usable))
    note = (
        f"cascade through tiers {' -> '.join(tiers)}, verifying each answer"
        if tiers
        else "cascade: no deployment of the route is available"
    )
    return _available_in_order(spec, spec.deployments, score, (note,))


def plan_select(spec: RouteSpec, score: float | None) -> Plan:
    """The cheapest deployment predicted to meet the route's quality target, then the
    others that meet it in cost order, then the rest (`router.target_selection`)."""
    if spec.choice is None:
        raise RoutingError(f"route '{spec.name}' selects by quality but nothing was predicted")
    usable = [v for v in spec.deployments if v.skip_reason(spec.needs) is None]
    choice = spec.choice.among({v.name for v in usable})
    by_name = {v.name: v for v in spec.deployments}
    views = [by_name[name] for name in choice.order]
    views += [v for v in spec.deployments if v.name not in choice.estimates]
    plan = _available_in_order(spec, views, score, tuple(choice.reasons()) if usable else ())
    return dataclasses.replace(plan, choice=choice if usable else None)


STRATEGIES: Mapping[str, StrategyType] = {
    "fixed": plan_fixed,
    "fallback": plan_fallback,
    "classifier": plan_classifier,
    "cascade": plan_cascade,
    "select": plan_select,
}

# Strategies that need the request's complexity score before planning.
SCORED_STRATEGIES = frozenset({"classifier"})


def plan_route(spec: RouteSpec, score: float | None = None) -> Plan:
    try:
        planner = STRATEGIES[spec.strategy]
    except KeyError:
        known = ", ".join(sorted(STRATEGIES))
        raise RoutingError(
            f"route '{spec.name}' has strategy '{spec.strategy}'; known strategies: {known}"
        ) from None
    return planner(spec, score)
