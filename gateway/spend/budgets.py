"""Budget status from the ledger: what each of the policy's budgets has spent in its
current period, how fast, and where that pace ends.

A period is the UTC day or calendar month that contains `now`. Spend is the ledger's
daily aggregates for the budget's key, team or route: the figure enforcement starts the
period from (`gateway.limits.ledger_spend`), so a budget added mid-period is enforced on
what it reports. The burn rate is the spend so
far over the time elapsed in the period (in days, fractions included); the forecast
carries that rate on to the period's end. Money is summed in integer nano-dollars.
"""

from __future__ import annotations

import calendar
import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from gateway.ledger.record import to_nanos, usd
from gateway.spend.report import Aggregates, FormatType, aggregate, csv_text, percent
from policies.access import Budget, BudgetPeriodType

# Flat columns of the CSV export (the JSON adds the daily burn-down and the forecast).
COLUMNS = (
    "scope",
    "name",
    "period",
    "period_start",
    "period_end",
    "limit_usd",
    "soft_limit_usd",
    "spent_usd",
    "remaining_usd",
    "used_pct",
    "burn_rate_usd_per_day",
    "forecast_usd",
    "soft_crossed",
    "hard_crossed",
    "forecast_over_limit",
    "exhausted_on",
)
# Dollar columns and the integer nano-dollar fields they are written from (exact, nine
# places, as the spend report's), limits included.
USD_NANOS = {
    "limit_usd": "limit_nanos",
    "soft_limit_usd": "soft_limit_nanos",
    "spent_usd": "spent_nanos",
    "remaining_usd": "remaining_nanos",
    "burn_rate_usd_per_day": "burn_rate_nanos_per_day",
    "forecast_usd": "forecast_nanos",
}
SECONDS_PER_DAY = 86400


@dataclass(frozen=True, slots=True)
class Period:
    """The budget period containing a moment: days `start` to `end`, both inclusive."""

    start: date
    end: date

    @classmethod
    def containing(cls, kind: BudgetPeriodType, now: datetime) -> Period:
        today = now.astimezone(UTC).date()
        if kind == "day":
            return cls(today, today)
        last = calendar.monthrange(today.year, today.month)[1]
        return cls(today.replace(day=1), today.replace(day=last))

    @property
    def days(self) -> int:
        return (self.end - self.start).days + 1

    def elapsed_days(self, now: datetime) -> float:
        """Days of the period gone by at `now`, at least one second's worth."""
        begin = datetime(self.start.year, self.start.month, self.start.day, tzinfo=UTC)
        return max((now - begin).total_seconds(), 1.0) / SECONDS_PER_DAY


def spent_by_day(rows: Sequence[Any], scope: str, name: str) -> dict[str, int]:
    return {row.group["day"]: row.cost_nanos for row in rows if row.group[scope] == name}


def budget_status(
    budget: Budget, period: Period, now: datetime, daily: Mapping[str, int]
) -> dict[str, Any]:
    """One budget's status, given its spend per day (`YYYY-MM-DD` -> nano-dollars)."""
    spent = sum(daily.values())
    limit = to_nanos(budget.limit_usd)
    soft = None if budget.soft_limit_usd is None else to_nanos(budget.soft_limit_usd)
    elapsed = min(period.elapsed_days(now), period.days)
    rate = round(spent / elapsed)  # nano-dollars per day
    forecast = round(rate * period.days)
    return {
        "scope": budget.scope,
        "name": budget.name,
        "period": budget.period,
        "period_start": period.start.isoformat(),
        "period_end": period.end.isoformat(),
        "limit_usd": usd(limit),
        "soft_limit_usd": None if soft is None else usd(soft),
        "spent_usd": usd(spent),
        "remaining_usd": usd(limit - spent),  # negative once overspent
        "used_pct": percent(spent, limit),
        "burn_rate_usd_per_day": usd(rate),
        "forecast_usd": usd(forecast),
        "soft_crossed": soft is not None and spent >= soft,
        "hard_crossed": spent >= limit,
        "forecast_over_limit": forecast >= limit,
        "exhausted_on": exhausted_on(period, now, spent, rate, limit),
        "burn_down": burn_down_line(period, now, daily),
        "forecast": forecast_line(period, now, spent, rate),
        "limit_nanos": limit,
        "soft_limit_nanos": soft,
        "spent_nanos": spent,
        "remaining_nanos": limit - spent,
        "burn_rate_nanos_per_day": rate,
        "forecast_nanos": forecast,
    }


def burn_down_line(period: Period, now: datetime, daily: Mapping[str, int]) -> list[dict[str, Any]]:
    """Spend per day and cumulative, from the period's first day to today."""
    today = min(now.astimezone(UTC).date(), period.end)
    points, cumulative = [], 0
    for offset in range((today - period.start).days + 1):
        day = (period.start + timedelta(days=offset)).isoformat()
        cumulative += daily.get(day, 0)
        points.append(
            {"day": day, "spent_usd": usd(daily.get(day, 0)), "cumulative_usd": usd(cumulative)}
        )
    return points


def exhausted_on(period: Period, now: datetime, spent: int, rate: int, limit: int) -> str | None:
    """The day the limit is (or, at this rate, will be) reached within the period."""
    if spent >= limit:
        return now.astimezone(UTC).date().isoformat()
    if rate <= 0:
        return None
    days_left = (limit - spent) / rate
    if days_left > period.days:  # not within the period (and no date overflow)
        return None
    when = (now + timedelta(days=days_left)).astimezone(UTC).date()
    return when.isoformat() if when <= period.end else None


def forecast_line(period: Period, now: datetime, spent: int, rate: int) -> list[dict[str, Any]]:
    """Projected cumulative spend at the end of each remaining day, from today on."""
    today = now.astimezone(UTC).date()
    points = []
    for offset in range((period.end - today).days + 1):
        day = today + timedelta(days=offset)
        end_of_day = datetime(day.year, day.month, day.day, tzinfo=UTC) + timedelta(days=1)
        ahead = (end_of_day - now).total_seconds() / SECONDS_PER_DAY
        points.append({"day": day.isoformat(), "cumulative_usd": usd(spent + round(rate * ahead))})
    return points


def owned_by(budget: Budget, teams: Collection[str], key_teams: Mapping[str, str]) -> bool:
    """Whether a budget belongs to one of `teams` (route budgets belong to none)."""
    if budget.scope == "team":
        return budget.name in teams
    return budget.scope == "key" and key_teams.get(budget.name) in teams


async def budget_statuses(
    store: Aggregates,
    budgets: Sequence[Budget],
    now: datetime,
    teams: Collection[str] | None = None,
    key_teams: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The status of each budget, in policy order; with `teams`, only theirs."""
    if teams is not None:
        budgets = [b for b in budgets if owned_by(b, teams, key_teams or {})]
    fetched: dict[tuple[Period, str], Any] = {}  # one ledger query per (period, scope)
    statuses = []
    for budget in budgets:
        period = Period.containing(budget.period, now)
        if (period, budget.scope) not in fetched:
            today = min(now.astimezone(UTC).date(), period.end)
            rows = await aggregate(store, period.start, today, ["day", budget.scope])
            fetched[period, budget.scope] = rows
        daily = spent_by_day(fetched[period, budget.scope], budget.scope, budget.name)
        statuses.append(budget_status(budget, period, now, daily))
    return statuses


def no_budgets_note(budgets: Sequence[Budget], teams: Collection[str] | None) -> str:
    """Why `budget_statuses` found none: the policy has none, or none is the teams'."""
    if not budgets:
        return "the policy has no budgets (its budgets section sets spending limits)"
    names = ", ".join(sorted(teams or ()))
    return (
        f"none of the policy's {len(budgets)} budget(s) belongs to team {names} "
        "(a team's budgets are its own and its keys'; route budgets belong to no team)"
    )


def render_budgets(statuses: list[dict[str, Any]], fmt: FormatType) -> str:
    """JSON (with the burn-down series) or CSV (the flat `COLUMNS`)."""
    if fmt == "json":
        return json.dumps(statuses, indent=2)
    return csv_text(statuses, COLUMNS, USD_NANOS)
