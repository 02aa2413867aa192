"""docs/spend.md lists the columns finance's exports have: the lists are read from the
doc and compared with what the running gateway's spend API returns."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import httpx

from tests.dashboards.conftest import FilledGateway, finance_headers

SPEND_DOC = Path(__file__).resolve().parents[2] / "docs" / "spend.md"


def documented(after: str, until: str) -> list[str]:
    """The `names` the doc writes between `after` and the first `until` past it."""
    text = " ".join(SPEND_DOC.read_text(encoding="utf-8").split())
    start = text.index(after) + len(after)
    return re.findall(r"`([a-z0-9_]+)`", text[start : text.index(until, start)])


def get(gateway: FilledGateway, path: str, **params: str) -> httpx.Response:
    reply = httpx.get(f"{gateway.url}{path}", params=params, headers=finance_headers())
    assert reply.status_code == 200, reply.text
    return reply


def test_the_documented_spend_columns_are_the_apis(bare: FilledGateway) -> None:
    columns = documented("CSV columns, in order: the `group_by` columns, then ", ". ")
    assert "error_rate_pct" in columns and "unreferenced_cost_usd" in columns
    reply = get(bare, "/v1/spend", group_by="team,route", format="csv")
    assert next(csv.reader(io.StringIO(reply.text))) == ["team", "route", *columns]
    # JSON rows: the same fields, then the documented extras, in order.
    extras = documented("JSON rows carry the same fields plus ", ", and the reply")
    assert "unreferenced_cost_nanos" in extras
    body = get(bare, "/v1/spend", group_by="team,route").json()
    for row in [*body["data"], {"team": None, "route": None, **body["total"]}]:
        assert list(row) == ["team", "route", *columns, *extras]


def test_the_documented_budget_columns_are_the_apis(bare: FilledGateway) -> None:
    columns = documented("Budget rows (", "; dollars")
    reply = get(bare, "/v1/spend/budgets", format="csv")
    assert next(csv.reader(io.StringIO(reply.text))) == columns
