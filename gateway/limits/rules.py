"""The limits a policy sets, compiled once per policy and looked up per request.

A request is bound by the budgets of its key, its team and its route, and by the rate
limits of its key and its team. `RuleBook.rules_for` answers `None` when none apply,
which is what keeps unlimited traffic off Redis entirely.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime

from gateway.ledger.record import to_nanos
from policies.access import Budget, BudgetPeriodType, BudgetScopeType, RateLimit
from policies.schema import Policy, Route

log = logging.getLogger(__name__)

PERIOD_ADJECTIVES: Mapping[str, str] = {"day": "daily", "month": "monthly"}
DEFAULT_MAX_OUTPUT_TOKENS: int = Route.model_fields["max_output_tokens"].default


@dataclass(frozen=True, slots=True)
class BudgetRule:
    scope: BudgetScopeType
    name: str
    period: BudgetPeriodType
    limit_nanos: int
    soft_nanos: int | None
    downgrade_tier: str | None

    @property
    def label(self) -> str:
        """`team 'research' daily budget`, for messages and logs."""
        return f"{self.scope} '{self.name}' {PERIOD_ADJECTIVES[self.period]} budget"


@dataclass(frozen=True, slots=True)
class RateRule:
    scope: BudgetScopeType  # "key" or "team"
    name: str
    requests_per_minute: int | None
    tokens_per_minute: int | None


@dataclass(frozen=True, slots=True)
class Rules:
    """Everything that limits one (key, team, route) combination."""

    budgets: tuple[BudgetRule, ...]
    rates: tuple[RateRule, ...]
    max_output_tokens: int  # the route's assumption when a request sets no max_tokens
    copies: int  # answers one request may pay for at once: 1, or 1 + max_hedges


@dataclass
class RuleBook:
    """A policy's limits by scope; `rules_for` caches its answers per combination."""

    budgets: Mapping[tuple[str, str], tuple[BudgetRule, ...]]
    rates: Mapping[tuple[str, str], RateRule]
    routes: Mapping[str, tuple[int, int]]  # route -> (max_output_tokens, copies)
    _cache: dict[tuple[str, str, str], Rules | None] = field(default_factory=dict)

    @classmethod
    def build(cls, policy: Policy) -> RuleBook:
        budgets: dict[tuple[str, str], tuple[BudgetRule, ...]] = {}
        for budget in _unique(policy.budgets):
            scope = (budget.scope, budget.name)
            budgets[scope] = (*budgets.get(scope, ()), _budget_rule(budget))
        rates: dict[tuple[str, str], RateRule] = {}
        owners: list[tuple[BudgetScopeType, str, RateLimit | None]] = [
            *(("key", name, key.rate_limit) for name, key in policy.keys.items()),
            *(("team", name, team.rate_limit) for name, team in policy.teams.items()),
        ]
        for kind, name, limit in owners:
            if limit is not None and (limit.requests_per_minute or limit.tokens_per_minute):
                rates[kind, name] = RateRule(
                    kind, name, limit.requests_per_minute, limit.tokens_per_minute
                )
        routes = {name: _route_terms(route) for name, route in policy.routes.items()}
        return cls(budgets, rates, routes)

    @property
    def empty(self) -> bool:
        return not self.budgets and not self.rates

    def rules_for(self, key: str, team: str, route: str) -> Rules | None:
        """The limits on a request by `key` of `team` on `route`; None if there are none."""
        combination = (key, team, route)
        if combination in self._cache:
            return self._cache[combination]
        found = self._cache[combination] = self._compile(key, team, route)
        return found

    def _compile(self, key: str, team: str, route: str) -> Rules | None:
        budgets = (
            *self.budgets.get(("key", key), ()),
            *self.budgets.get(("team", team), ()),
            *self.budgets.get(("route", route), ()),
        )
        rates = tuple(
            rule for rule in (self.rates.get(("key", key)), self.rates.get(("team", team))) if rule
        )
        if not budgets and not rates:
            return None
        max_output, copies = self.routes.get(route, (DEFAULT_MAX_OUTPUT_TOKENS, 1))
        return Rules(budgets, rates, max_output, copies)


def _unique(budgets: list[Budget]) -> list[Budget]:
    """One budget per (scope, name, period): they share Redis keys. A duplicate keeps
    the lower limit, so the stricter declaration wins."""
    chosen: dict[tuple[str, str, str], Budget] = {}
    for budget in budgets:
        slot = (budget.scope, budget.name, budget.period)
        earlier = chosen.get(slot)
        if earlier is not None:
            log.warning("%s %s budget is declared twice; the lower limit applies", *slot[:2])
            if earlier.limit_usd <= budget.limit_usd:
                continue
        chosen[slot] = budget
    return list(chosen.values())


def _budget_rule(budget: Budget) -> BudgetRule:
    soft = None if budget.soft_limit_usd is None else to_nanos(budget.soft_limit_usd)
    return BudgetRule(
        budget.scope,
        budget.name,
        budget.period,
        to_nanos(budget.limit_usd),
        soft,
        budget.downgrade_tier,
    )


def _route_terms(route: Route) -> tuple[int, int]:
    sla = route.sla
    copies = 1 + sla.max_hedges if sla is not None and sla.hedge_after_ms is not None else 1
    return route.max_output_tokens, copies


@dataclass(frozen=True, slots=True)
class Period:
    """One UTC day or month: its id in key names and when it ends (epoch seconds)."""

    id: str
    ends_at: float

    @property
    def ends_iso(self) -> str:
        return datetime.fromtimestamp(self.ends_at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    @property
    def first_day(self) -> date:
        return date.fromisoformat(self.id if len(self.id) == len("YYYY-MM-DD") else f"{self.id}-01")

    @property
    def last_day(self) -> date:
        return datetime.fromtimestamp(self.ends_at - 1, UTC).date()


class Calendar:
    """The current day and month in UTC, recomputed only when the day changes."""

    def __init__(self) -> None:
        self._day = -1
        self._periods: dict[str, Period] = {}

    def period(self, kind: BudgetPeriodType, now: float) -> Period:
        day = int(now // 86400)
        if day != self._day:
            self._periods = periods_at(now)
            self._day = day
        return self._periods[kind]


def periods_at(now: float) -> dict[str, Period]:
    moment = datetime.fromtimestamp(now, UTC)
    midnight = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    first = midnight.replace(day=1)
    next_month = first.replace(year=first.year + first.month // 12, month=first.month % 12 + 1)
    return {
        "day": Period(moment.strftime("%Y-%m-%d"), midnight.timestamp() + 86400),
        "month": Period(moment.strftime("%Y-%m"), next_month.timestamp()),
    }
