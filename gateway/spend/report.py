"""Spend reports from the ledger's aggregates: rows finance can read and export.

Each row: the group's values, requests, errors, tokens, cost, the counterfactual cost
on the routes' reference models, and the savings (absolute and percent).
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import date
from typing import Any, Literal

from gateway.ledger import AggregateRow, LedgerStore
from gateway.ledger.record import usd

FormatType = Literal["csv", "json"]
COLUMNS = (
    "requests",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "reference_cost_usd",
    "savings_usd",
    "savings_pct",
)


def report_row(row: AggregateRow) -> dict[str, Any]:
    reference = row.reference_cost_nanos
    return {
        **row.group,
        "requests": row.requests,
        "errors": row.errors,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "cost_usd": round(usd(row.cost_nanos), 9),
        "reference_cost_usd": round(usd(reference), 9),
        "savings_usd": round(usd(row.savings_nanos), 9),
        "savings_pct": round(100 * row.savings_nanos / reference, 2) if reference else 0.0,
    }


async def spend_report(
    store: LedgerStore, day_from: date, day_to: date, group_by: Sequence[str]
) -> list[dict[str, Any]]:
    return [report_row(row) for row in await store.aggregate(day_from, day_to, group_by)]


def render(rows: list[dict[str, Any]], group_by: Sequence[str], fmt: FormatType) -> str:
    if fmt == "json":
        return json.dumps(rows, indent=2)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=[*group_by, *COLUMNS], lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()
