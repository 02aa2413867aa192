"""The spend API against a ledger filled by real requests through the gateway: its
numbers reconcile with the ledger's per-request events to the nano-dollar."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from gateway.ledger import SpendRecord
from gateway.spend.report import COLUMNS, usd_text
from tests.dashboards.conftest import (
    ADMIN_HEADERS,
    BARE_REQUESTS,
    CLIENT_KEYS,
    REFUSED,
    TRAFFIC,
    FilledGateway,
    finance_headers,
)

TODAY = datetime.now(UTC).date().isoformat()


@pytest.fixture(autouse=True)
def _today(monkeypatch: pytest.MonkeyPatch) -> None:
    """TODAY is each test's own day: taken at import, a run crossing midnight UTC asked
    for yesterday's spend while its requests were filed under today."""
    monkeypatch.setattr(sys.modules[__name__], "TODAY", datetime.now(UTC).date().isoformat())


MONEY = ("cost_nanos", "reference_cost_nanos")


def get(gateway: FilledGateway, path: str, **params: str) -> httpx.Response:
    return httpx.get(f"{gateway.url}{path}", params=params, headers=finance_headers(), timeout=10)


def sums(
    records: Iterable[SpendRecord], group_by: Sequence[str]
) -> dict[tuple[str, ...], list[int]]:
    """The events stream summed by hand: requests, tokens and money per group."""
    totals: dict[tuple[str, ...], list[int]] = defaultdict(lambda: [0] * 5)
    for rec in records:
        row = totals[tuple(rec.dimension(name) for name in group_by)]
        row[0] += 1
        row[1] += rec.prompt_tokens
        row[2] += rec.completion_tokens
        row[3] += rec.cost_nanos
        row[4] += rec.reference_cost_nanos
    return dict(totals)


def figures(row: dict[str, Any]) -> list[int]:
    return [row[name] for name in ("requests", "prompt_tokens", "completion_tokens", *MONEY)]


@pytest.mark.parametrize(
    "group_by", [["team", "model"], ["key"], ["route", "tier"], ["deployment", "day"], []]
)
async def test_report_reconciles_with_the_events_stream_to_the_nano_dollar(
    filled: FilledGateway, group_by: list[str]
) -> None:
    events = filled.events
    assert sorted(e.record_id for e in events) == sorted(r.record_id for r in filled.records)
    expected = sums(events, group_by)

    reply = get(filled, "/v1/spend", **{"from": TODAY, "to": TODAY, "group_by": ",".join(group_by)})
    assert reply.status_code == 200, reply.text
    assert reply.headers["cache-control"] == "no-store"
    body = reply.json()
    got = {tuple(row[name] for name in group_by): figures(row) for row in body["data"]}
    assert got == expected
    everything = sums(events, [])[()]
    assert figures(body["total"]) == everything
    for row in body["data"]:
        assert row["savings_nanos"] == row["reference_cost_nanos"] - row["cost_nanos"]
        assert row["cost_usd"] == round(row["cost_nanos"] / 1e9, 9)
        assert row["savings_pct"] == round(
            100 * row["savings_nanos"] / row["reference_cost_nanos"], 2
        )

    # The CSV carries the same numbers, dollars written exactly.
    text = get(
        filled,
        "/v1/spend",
        **{"from": TODAY, "to": TODAY, "group_by": ",".join(group_by), "format": "csv"},
    ).text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == [*group_by, *COLUMNS]
    for row in rows:
        requests, prompt, completion, cost, reference = expected[tuple(row[n] for n in group_by)]
        assert (int(row["requests"]), int(row["prompt_tokens"])) == (requests, prompt)
        assert int(row["completion_tokens"]) == completion
        assert row["cost_usd"] == usd_text(cost)
        assert row["reference_cost_usd"] == usd_text(reference)
        assert row["savings_usd"] == usd_text(reference - cost)


async def test_team_filter_sort_and_limit(filled: FilledGateway) -> None:
    events = filled.events
    research = [e for e in events if e.team == "research"]
    reply = get(filled, "/v1/spend", group_by="key", team="research", sort="-cost_usd", limit="1")
    body = reply.json()
    by_key = sums(research, ["key"])
    top = max(by_key, key=lambda k: by_key[k][3])
    assert [row["key"] for row in body["data"]] == [top[0]]
    assert body["team"] == ["research"]
    assert figures(body["total"]) == sums(research, [])[()]  # the total ignores `limit`

    both = get(filled, "/v1/spend", group_by="team", team="research,sales").json()
    assert [row["team"] for row in both["data"]] == ["research", "sales"]
    ascending = get(filled, "/v1/spend", group_by="key", sort="cost_usd").json()["data"]
    assert [r["cost_nanos"] for r in ascending] == sorted(r["cost_nanos"] for r in ascending)


@pytest.mark.parametrize(
    ("params", "param"),
    [
        ({"from": "2026-13-01"}, "from"),
        ({"to": "yesterday"}, "to"),
        ({"from": "2026-11-30", "to": "2026-11-01"}, "from"),
        ({"from": "2024-01-01", "to": "2026-01-01"}, "from"),
        ({"group_by": "team,colour"}, "group_by"),
        ({"format": "xlsx"}, "format"),
        ({"limit": "0"}, "limit"),
        ({"sort": "-price"}, "sort"),
        ({"team": ""}, "team"),
        ({"groupby": "team"}, "groupby"),
    ],
)
def test_bad_parameters_are_openai_400s_naming_the_parameter(
    filled: FilledGateway, params: dict[str, str], param: str
) -> None:
    reply = get(filled, "/v1/spend", **params)
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert param in error["message"]


def test_only_finance_and_admin_keys_read_spend(filled: FilledGateway) -> None:
    url = f"{filled.url}/v1/spend"
    assert httpx.get(url).status_code == 401  # anonymous callers get no spend
    assert httpx.get(url, headers=finance_headers("fake-nope-key")).status_code == 401
    client = httpx.get(url, headers=finance_headers(CLIENT_KEYS["sales-1"][0]))
    assert client.status_code == 403
    assert client.json()["error"]["code"] == "finance_key_required"
    assert httpx.get(url, headers=ADMIN_HEADERS).status_code == 200
    access = httpx.get(f"{filled.url}/v1/spend/access", headers=finance_headers())
    assert access.json() == {"role": "finance"}
    assert (
        httpx.get(f"{filled.url}/v1/spend/access", headers=ADMIN_HEADERS).json()["role"] == "admin"
    )


async def test_budget_status_from_the_ledger(filled: FilledGateway) -> None:
    events = filled.events
    now = datetime.now(UTC)
    reply = get(filled, "/v1/spend/budgets")
    assert reply.status_code == 200
    budgets = {(b["scope"], b["name"]): b for b in reply.json()["data"]}
    assert list(budgets) == [("team", "research"), ("key", "sales-1"), ("route", "auto")]

    research = budgets["team", "research"]
    spent = sum(e.cost_nanos for e in events if e.team == "research")
    assert research["spent_nanos"] == spent > 0
    assert research["period_start"] == now.date().replace(day=1).isoformat()
    assert research["soft_crossed"] and not research["hard_crossed"]  # soft: $0.000001
    assert research["remaining_usd"] == pytest.approx(100 - spent / 1e9)
    assert research["remaining_nanos"] == 100 * 10**9 - spent
    assert research["burn_down"][-1] == {
        "day": now.date().isoformat(),
        "spent_usd": spent / 1e9,
        "cumulative_usd": spent / 1e9,
    }
    assert research["forecast"][-1]["day"] == research["period_end"]
    assert research["forecast_usd"] >= research["spent_usd"]

    sales = budgets["key", "sales-1"]
    assert sales["period_start"] == sales["period_end"] == now.date().isoformat()
    assert sales["spent_nanos"] == sum(e.cost_nanos for e in events if e.key == "sales-1")
    assert not sales["soft_crossed"] and not sales["hard_crossed"]
    elapsed_days = (
        now - now.replace(hour=0, minute=0, second=0, microsecond=0)
    ).total_seconds() / 86400
    assert sales["burn_rate_usd_per_day"] == pytest.approx(
        sales["spent_usd"] / elapsed_days, rel=0.01
    )

    auto = budgets["route", "auto"]
    assert auto["spent_nanos"] == sum(e.cost_nanos for e in events if e.route == "auto")

    # A team filter keeps that team's budgets (its own and its keys'), no route budgets.
    sales_only = get(filled, "/v1/spend/budgets", team="sales").json()["data"]
    assert [(b["scope"], b["name"]) for b in sales_only] == [("key", "sales-1")]
    text = get(filled, "/v1/spend/budgets", format="csv").text
    rows = list(csv.DictReader(io.StringIO(text)))
    assert rows[0]["name"] == "research" and rows[0]["soft_crossed"] == "true"
    assert rows[0]["spent_usd"] == usd_text(spent)


async def test_sla_attainment_per_route(filled: FilledGateway) -> None:
    events = filled.events
    reply = get(filled, "/v1/spend/sla", **{"from": TODAY, "to": TODAY})
    rows = {row["route"]: row for row in reply.json()["data"]}
    assert set(rows) == {"auto", "strict"}  # `strong` has no SLA
    auto = [e for e in events if e.route == "auto"]
    assert all(e.sla_met is True for e in auto)
    assert rows["auto"] == {
        "route": "auto",
        "ttft_ms": 20000,
        "timeout_ms": 60000,
        "requests": len(auto),
        "sla_requests": len(auto),
        "sla_met": len(auto),
        "sla_missed": 0,
        "attainment_pct": 100.0,
    }
    strict = rows["strict"]  # a 1 ms TTFT: nothing meets it
    assert (strict["sla_met"], strict["attainment_pct"]) == (0, 0.0)
    assert strict["sla_missed"] == sum(1 for e in events if e.route == "strict") > 0
    research = get(filled, "/v1/spend/sla", team="research").json()["data"]
    assert {r["route"]: r["sla_requests"] for r in research}["strict"] == 0


def test_cli_prints_the_report_and_budgets(
    filled: FilledGateway, redis_url: str, redis_prefix: str, tmp_path: Any
) -> None:
    env = {
        **os.environ,
        "REDIS_URL": redis_url,
        "CASCADE_REDIS_PREFIX": redis_prefix,
        "CASCADE_POLICY": str(tmp_path / "policy-0.yaml"),
    }
    env.update(
        {"FINANCE_KEY": "x", "KEY_RESEARCH_1": "a", "KEY_RESEARCH_2": "b", "KEY_SALES_1": "c"}
    )
    env["UPSTREAM_BASE_URL"] = "http://127.0.0.1:9/v1"
    run = [sys.executable, "-m", "gateway.cli", "spend"]
    day = ["--from", TODAY, "--to", TODAY]
    report = subprocess.run(
        [*run, "report", *day, "--group-by", "team", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # The whole reply, total included, for the same range.
    api = get(filled, "/v1/spend", group_by="team", **{"from": TODAY, "to": TODAY}).json()
    assert json.loads(report.stdout) == api
    budgets = subprocess.run(
        [*run, "budgets", "--format", "json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    from_cli = json.loads(budgets.stdout)
    from_api = get(filled, "/v1/spend/budgets").json()["data"]
    assert [b["spent_nanos"] for b in from_cli] == [b["spent_nanos"] for b in from_api]
    table = subprocess.run(
        [*run, "budgets"], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert table.stdout.splitlines()[0].startswith("scope,name,period,")


def test_days_default_to_the_last_thirty(filled: FilledGateway) -> None:
    body = get(filled, "/v1/spend").json()
    today = datetime.now(UTC).date()
    assert (body["from"], body["to"]) == (
        (today - timedelta(days=29)).isoformat(),
        today.isoformat(),
    )
    assert body["total"]["requests"] == len(TRAFFIC)


COMPARED = ("reference_cost_usd", "savings_usd", "savings_pct")


async def test_a_route_without_a_reference_model_has_no_savings(bare: FilledGateway) -> None:
    """Nothing to compare with is no figure: `plain` has no reference_model, so its
    records carry no reference (not its first deployment's price: the fallback answered
    by `premium` read as a -1,566.67% saving) and the report leaves its savings empty."""
    plain = [r for r in bare.records if r.route == "plain"]
    assert all(r.reference_model is None and r.reference_cost_nanos == 0 for r in plain)
    assert {r.deployment for r in plain if r.status == "ok"} == {"cheap", "premium"}
    cost = sum(r.cost_nanos for r in plain)

    body = get(bare, "/v1/spend", group_by="route").json()
    rows = {row["route"]: row for row in body["data"]}
    assert rows["plain"]["reference_coverage"] == "none"
    for column in (*COMPARED, "reference_cost_nanos", "savings_nanos"):
        assert rows["plain"][column] is None, column
    assert rows["plain"]["unreferenced_cost_nanos"] == rows["plain"]["cost_nanos"] == cost > 0
    auto = rows["auto"]
    assert (auto["reference_coverage"], auto["unreferenced_cost_nanos"]) == ("full", 0)
    assert auto["savings_nanos"] == auto["reference_cost_nanos"] - auto["cost_nanos"] > 0

    # The total compares what can be compared and says what it leaves out.
    total = body["total"]
    assert (total["reference_coverage"], total["unreferenced_cost_nanos"]) == ("partial", cost)
    assert total["cost_nanos"] == auto["cost_nanos"] + cost
    assert (total["savings_nanos"], total["savings_pct"]) == (
        auto["savings_nanos"],
        auto["savings_pct"],
    )
    ops = get(bare, "/v1/spend", team="ops").json()["total"]  # ops only used `plain`
    assert (ops["reference_coverage"], ops["savings_usd"], ops["savings_pct"]) == (
        "none",
        None,
        None,
    )

    # CSV: empty cells, neither a zero nor a loss.
    text = get(bare, "/v1/spend", group_by="route", format="csv").text
    csv_rows = {row["route"]: row for row in csv.DictReader(io.StringIO(text))}
    assert [csv_rows["plain"][column] for column in COMPARED] == ["", "", ""]
    assert csv_rows["plain"]["unreferenced_cost_usd"] == usd_text(cost)
    assert csv_rows["auto"]["savings_usd"] == usd_text(auto["savings_nanos"])

    # Rows without savings sort last, either way.
    for sort in ("savings_usd", "-savings_pct"):
        data = get(bare, "/v1/spend", group_by="route", sort=sort).json()["data"]
        assert [row["route"] for row in data] == ["auto", "plain"]


def test_errors_and_the_error_rate_per_row_and_in_total(bare: FilledGateway) -> None:
    body = get(bare, "/v1/spend", group_by="route").json()
    rows = {row["route"]: row for row in body["data"]}
    assert (rows["plain"]["requests"], rows["plain"]["errors"]) == (7, REFUSED)
    assert rows["plain"]["error_rate_pct"] == round(100 * REFUSED / 7, 2)
    assert rows["auto"]["error_rate_pct"] == 0.0
    total = body["total"]
    assert (total["requests"], total["errors"]) == (BARE_REQUESTS, REFUSED)
    assert total["error_rate_pct"] == 40.0
    empty = get(bare, "/v1/spend", **{"from": "2020-01-01", "to": "2020-01-31"}).json()
    assert empty["total"]["error_rate_pct"] is None  # no requests: no rate, not 0%
    text = get(bare, "/v1/spend", group_by="route", format="csv").text
    csv_rows = {row["route"]: row for row in csv.DictReader(io.StringIO(text))}
    assert csv_rows["plain"]["error_rate_pct"] == str(rows["plain"]["error_rate_pct"])


def test_an_empty_reply_says_why(bare: FilledGateway) -> None:
    """`note` names the reason a list is empty: no requests in the range, no budgets in
    the policy, no route with an SLA (not "no spend" for all three)."""
    spend = get(bare, "/v1/spend", **{"from": "2020-01-01", "to": "2020-01-31"}).json()
    assert (spend["data"], spend["note"]) == ([], "no requests from 2020-01-01 to 2020-01-31")
    spend = get(bare, "/v1/spend", team="nobody").json()
    assert spend["note"] is not None and spend["note"].startswith("no requests by team nobody")
    assert get(bare, "/v1/spend").json()["note"] is None
    budgets = get(bare, "/v1/spend/budgets").json()
    assert budgets["data"] == [] and budgets["note"].startswith("the policy has no budgets")
    sla = get(bare, "/v1/spend/sla").json()
    assert sla["data"] == [] and sla["note"].startswith("no route in the policy has an SLA")


def test_budgets_of_other_teams_are_no_missing_budgets(filled: FilledGateway) -> None:
    mine = get(filled, "/v1/spend/budgets", team="nobody").json()
    assert mine["data"] == []
    assert mine["note"].startswith("none of the policy's 3 budget(s) belongs to team nobody")
    assert get(filled, "/v1/spend/budgets").json()["note"] is None
    assert get(filled, "/v1/spend/sla").json()["note"] is None
