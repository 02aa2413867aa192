"""The spend package's arithmetic without a gateway: periods, burn rate, forecast,
exact dollars, and the team filter's roll-up, on the in-memory ledger store."""

from __future__ import annotations

from datetime import UTC, date, datetime

import pytest

from gateway.ledger import AggregateRow, MemoryStore, SpendRecord
from gateway.spend.budgets import Period, budget_status, budget_statuses, exhausted_on
from gateway.spend.report import aggregate, report_row, total, usd_text
from policies.access import Budget
from tests.gateway.ledger_fixtures import DAY0, make_record

NOON = datetime(2026, 11, 16, 12, tzinfo=UTC)  # half-way through day 16 of 30


def test_periods_are_the_utc_day_or_calendar_month() -> None:
    assert Period.containing("day", NOON) == Period(date(2026, 11, 16), date(2026, 11, 16))
    month = Period.containing("month", NOON)
    assert (month.start, month.end, month.days) == (date(2026, 11, 1), date(2026, 11, 30), 30)
    assert Period.containing("month", datetime(2028, 2, 10, tzinfo=UTC)).days == 29
    assert month.elapsed_days(NOON) == 15.5


def test_burn_rate_forecast_and_crossings() -> None:
    budget = Budget(scope="team", name="research", period="month", limit_usd=31, soft_limit_usd=10)
    daily = {"2026-11-01": 5_000_000_000, "2026-11-16": 10_500_000_000}  # $15.50 by noon, day 16
    status = budget_status(budget, Period.containing("month", NOON), NOON, daily)
    assert status["spent_usd"] == 15.5
    assert status["burn_rate_usd_per_day"] == 1.0  # $15.50 over 15.5 days
    assert status["forecast_usd"] == 30.0  # ... for 30 days
    assert (status["soft_crossed"], status["hard_crossed"]) == (True, False)
    assert status["forecast_over_limit"] is False
    assert status["remaining_usd"] == 15.5
    assert status["exhausted_on"] is None  # $15.50 more at $1/day is past the 30th
    assert len(status["burn_down"]) == 16
    assert status["burn_down"][0] == {"day": "2026-11-01", "spent_usd": 5.0, "cumulative_usd": 5.0}
    assert status["burn_down"][1]["cumulative_usd"] == 5.0  # a day with no spend
    assert status["forecast"][0] == {"day": "2026-11-16", "cumulative_usd": 16.0}
    assert status["forecast"][-1] == {"day": "2026-11-30", "cumulative_usd": 30.0}


def test_an_overspent_budget() -> None:
    budget = Budget(scope="key", name="k", period="day", limit_usd=1)
    status = budget_status(budget, Period.containing("day", NOON), NOON, {"2026-11-16": 2 * 10**9})
    assert status["hard_crossed"] and status["soft_crossed"] is False  # no soft limit set
    assert status["remaining_usd"] == -1.0
    assert status["exhausted_on"] == "2026-11-16"
    assert status["burn_rate_usd_per_day"] == 4.0  # $2 in half a day
    assert status["forecast_usd"] == 4.0


def test_exhausted_on_stays_in_the_period_and_never_overflows() -> None:
    month = Period.containing("month", NOON)
    assert exhausted_on(month, NOON, 10, 2 * 10**9, 10 * 10**9) == "2026-11-21"  # 5 days on
    assert exhausted_on(month, NOON, 10, 1, 10**18) is None
    assert exhausted_on(month, NOON, 10, 0, 100) is None


def test_usd_text_is_exact() -> None:
    assert usd_text(0) == "0.000000000"
    assert usd_text(1_500) == "0.000001500"
    assert usd_text(12_345_678_901_234) == "12345.678901234"
    assert usd_text(-7) == "-0.000000007"


async def test_team_filter_rolls_up_to_the_asked_groups() -> None:
    store = MemoryStore()
    records = [make_record(i, day=i % 2) for i in range(24)]
    for rec in records:
        await store.record(rec)
    rows = await aggregate(store, DAY0, DAY0.replace(day=29), ["model"], {"research", "ops"})
    kept = [r for r in records if r.team in ("research", "ops")]
    by_model = {row.group["model"]: row for row in rows}
    for model, row in by_model.items():
        mine = [r for r in kept if r.model == model]
        assert row.requests == len(mine)
        assert row.cost_nanos == sum(r.cost_nanos for r in mine)
        assert row.sla_met == sum(r.sla_met is True for r in mine)
    assert total(rows).cost_nanos == sum(r.cost_nanos for r in kept)
    assert total([]).requests == 0


def test_report_row_figures() -> None:
    empty = report_row(total([]))  # no records: no reference, no percentage of nothing
    assert (empty["savings_pct"], empty["reference_coverage"]) == (None, "none")
    assert (empty["error_rate_pct"], empty["cost_per_1k_requests_nanos"]) == (None, None)


@pytest.mark.parametrize("period", ["day", "month"])
async def test_budget_statuses_read_the_store(period: str) -> None:
    store = MemoryStore()
    now = datetime.now(UTC)
    await store.record(make_record(1, ts=now.timestamp(), team="research", cost_nanos=123))
    budgets = [Budget(scope="team", name="research", period=period, limit_usd=1)]  # type: ignore[arg-type]
    [status] = await budget_statuses(store, budgets, now)
    assert status["spent_nanos"] == 123
    assert await budget_statuses(store, budgets, now, teams={"sales"}, key_teams={}) == []


async def test_records_without_a_reference_are_left_out_of_the_savings() -> None:
    store = MemoryStore()
    compared = make_record(1, route="auto", cost_nanos=100, reference_cost_nanos=400)
    alone = make_record(
        2, route="plain", cost_nanos=50, reference_model=None, reference_cost_nanos=0
    )
    for rec in (compared, alone):
        await store.record(rec)
    assert not alone.has_reference
    rows = {r.group["route"]: r for r in await store.aggregate(DAY0, DAY0, ["route"])}
    assert (rows["plain"].coverage, rows["plain"].savings_nanos) == ("none", None)
    assert (rows["auto"].coverage, rows["auto"].savings_nanos) == ("full", 300)
    [both] = await store.aggregate(DAY0, DAY0, [])
    assert (both.coverage, both.savings_nanos, both.unreferenced_cost_nanos) == ("partial", 300, 50)
    row = report_row(rows["plain"])
    assert (row["reference_cost_usd"], row["savings_usd"], row["savings_pct"]) == (None, None, None)
    assert row["unreferenced_cost_usd"] == 5e-8


def test_rows_and_records_written_before_references_were_optional_read_as_before() -> None:
    """Aggregates without the `unreferenced` counters (days written by an older
    version) compare everything, as they did; an old record's JSON reads back as is."""
    old = AggregateRow({}, 2, 1, 10, 5, cost_nanos=300, reference_cost_nanos=900, calls=1)
    assert (old.coverage, old.savings_nanos, report_row(old)["savings_pct"]) == ("full", 600, 66.67)
    data = make_record(1).to_dict()
    assert SpendRecord.from_dict(data).reference_model == "gpt-4o"
    as_strings = {name: str(value) for name, value in {**data, "reference_model": None}.items()}
    assert SpendRecord.from_dict(as_strings).reference_model is None
