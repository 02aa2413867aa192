"""Spend reports from the ledger's aggregates: rows finance can read and export.

Each row: the group's values, requests, errors and error rate, tokens, cost, the
counterfactual cost on the routes' reference models, the savings (absolute and
percent), the cost left out of them, the cost per 1,000 requests, the upstream calls
priced, the token classes priced apart (cache reads and writes, reasoning, audio,
image) and what the prompt cache saved. JSON rows also carry the money as integer
nano-dollars; CSV writes dollars as exact decimals (nine places), never as floats, so
both reconcile with the ledger to the nano-dollar.

Savings compare a request's cost with what it would have cost on its route's
`reference_model`. Requests on a route without one have nothing to be compared with:
their cost is `unreferenced_cost_usd`, left out of the savings, and a row made only of
them has no reference cost and no savings (null in JSON, an empty cell in CSV, and
`reference_coverage` "none"), rather than a figure priced against itself.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Collection, Mapping, Sequence
from datetime import date
from typing import TYPE_CHECKING, Any, Literal, Protocol

from gateway.ledger import AggregateRow
from gateway.ledger.record import NANOS_PER_USD, usd
from gateway.ledger.rollup import METRICS, Rollup, check_group_by

if TYPE_CHECKING:  # the query's module reads FormatType from this one
    from gateway.spend.query import SpendQuery

FormatType = Literal["csv", "json"]
COLUMNS = (
    "requests",
    "errors",
    "error_rate_pct",
    "prompt_tokens",
    "completion_tokens",
    "cost_usd",
    "reference_cost_usd",
    "savings_usd",
    "savings_pct",
    "unreferenced_cost_usd",
    "cost_per_1k_requests_usd",
    "calls",
    # Token classes: parts of prompt_tokens and completion_tokens, priced apart.
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "audio_prompt_tokens",
    "audio_completion_tokens",
    "image_prompt_tokens",
    "image_completion_tokens",
    "cache_savings_usd",
)
TOKEN_CLASS_COLUMNS = COLUMNS[COLUMNS.index("cache_read_tokens") : -1]
# Dollar columns and the integer nano-dollar fields (JSON only) they are written from.
USD_NANOS = {
    "cost_usd": "cost_nanos",
    "reference_cost_usd": "reference_cost_nanos",
    "savings_usd": "savings_nanos",
    "unreferenced_cost_usd": "unreferenced_cost_nanos",
    "cost_per_1k_requests_usd": "cost_per_1k_requests_nanos",
    "cache_savings_usd": "cache_savings_nanos",
}


class Aggregates(Protocol):
    """What a report reads: a `LedgerStore` or the gateway's `CostLedger`."""

    async def aggregate(
        self, day_from: date, day_to: date, group_by: Sequence[str]
    ) -> list[AggregateRow]: ...


def usd_text(nanos: int) -> str:
    """Exact dollars with nine decimals: `usd_text(1_500) == "0.000001500"`."""
    sign = "-" if nanos < 0 else ""
    whole, frac = divmod(abs(nanos), NANOS_PER_USD)
    return f"{sign}{whole}.{frac:09d}"


def percent(part: int, whole: int) -> float | None:
    """`part` as a percentage of `whole`; None when the whole is 0 (a share of nothing
    is no figure, not 0%)."""
    return round(100 * part / whole, 2) if whole else None


def dollars(nanos: int | None) -> float | None:
    return None if nanos is None else round(usd(nanos), 9)


def per_1k_requests(row: AggregateRow) -> int | None:
    """Cost per 1,000 requests in nano-dollars, rounded half up; None for a row with no
    requests (a deployment that only answered escalations, judge calls or hedges: its
    cost has no requests to be shared by, which is no figure, not 0)."""
    if not row.requests:
        return None
    return (row.cost_nanos * 1000 + row.requests // 2) // row.requests


def report_row(row: AggregateRow) -> dict[str, Any]:
    savings = row.savings_nanos
    reference = None if savings is None else row.reference_cost_nanos
    per_1k = per_1k_requests(row)
    return {
        **row.group,
        "requests": row.requests,
        "errors": row.errors,
        "error_rate_pct": percent(row.errors, row.requests),
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "cost_usd": dollars(row.cost_nanos),
        "reference_cost_usd": dollars(reference),
        "savings_usd": dollars(savings),
        "savings_pct": None if savings is None else percent(savings, reference or 0),
        "unreferenced_cost_usd": dollars(row.unreferenced_cost_nanos),
        "cost_per_1k_requests_usd": dollars(per_1k),
        "calls": row.calls,
        **{column: getattr(row, column) for column in TOKEN_CLASS_COLUMNS},
        "cache_savings_usd": dollars(row.cache_savings_nanos),
        "reference_coverage": row.coverage,
        "cost_nanos": row.cost_nanos,
        "reference_cost_nanos": reference,
        "savings_nanos": savings,
        "unreferenced_cost_nanos": row.unreferenced_cost_nanos,
        "cost_per_1k_requests_nanos": per_1k,
        "cache_savings_nanos": row.cache_savings_nanos,
    }


async def aggregate(
    store: Aggregates,
    day_from: date,
    day_to: date,
    group_by: Sequence[str],
    teams: Collection[str] | None = None,
) -> list[AggregateRow]:
    """The store's rows, limited to `teams` when given (then grouped by team as well,
    filtered, and summed back up to `group_by`)."""
    names = check_group_by(group_by)
    if teams is None:
        return await store.aggregate(day_from, day_to, names)
    wide = names if "team" in names else (*names, "team")
    rollup = Rollup(names)
    for row in await store.aggregate(day_from, day_to, wide):
        if row.group["team"] in teams:
            group = tuple(row.group[name] for name in names)
            rollup.add(group, [getattr(row, metric) for metric in METRICS])
    return rollup.rows()


def total(rows: Sequence[AggregateRow]) -> AggregateRow:
    """All rows summed into one (zeros for none)."""
    rollup = Rollup(())
    rollup.add((), [0] * len(METRICS))
    for row in rows:
        rollup.add((), [getattr(row, metric) for metric in METRICS])
    return rollup.rows()[0]


async def spend_report(
    store: Aggregates,
    day_from: date,
    day_to: date,
    group_by: Sequence[str],
    teams: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    rows = await aggregate(store, day_from, day_to, group_by, teams)
    return [report_row(row) for row in rows]


def csv_text(
    rows: Sequence[Mapping[str, Any]],
    columns: Sequence[str],
    usd_nanos: Mapping[str, str] = USD_NANOS,
) -> str:
    """`rows` as CSV with a header. Dollar columns named in `usd_nanos` are written
    exactly from their nano-dollar fields; None is an empty cell; booleans are words."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([csv_value(row, column, usd_nanos) for column in columns])
    return out.getvalue()


def csv_value(row: Mapping[str, Any], column: str, usd_nanos: Mapping[str, str]) -> Any:
    nanos = usd_nanos.get(column)
    if nanos is not None and nanos in row:
        return "" if row[nanos] is None else usd_text(row[nanos])
    value = row[column]
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else value


def report_body(
    query: SpendQuery, rows: Sequence[AggregateRow], data: list[dict[str, Any]]
) -> dict[str, Any]:
    """The JSON reply of `GET /v1/spend`, which `spend report --format json` prints too:
    `data` (the report rows, as sorted and cut for the reply), the total of every row
    in `rows` (whatever `limit` kept), and why there are no rows in `note`."""
    return {
        "object": "spend.report",
        **range_of(query),
        "group_by": list(query.group_by),
        "data": data,
        "total": report_row(total(rows)),
        "note": None if data else no_spend_note(query),
    }


def range_of(query: SpendQuery) -> dict[str, Any]:
    teams = None if query.teams is None else sorted(query.teams)
    return {"from": query.day_from.isoformat(), "to": query.day_to.isoformat(), "team": teams}


def no_spend_note(query: SpendQuery) -> str:
    """Why a report has no rows: nothing was recorded in its range (for its teams)."""
    teams = "" if query.teams is None else f" by team {', '.join(sorted(query.teams))}"
    return f"no requests{teams} from {query.day_from} to {query.day_to}"


def render(query: SpendQuery, rows: Sequence[AggregateRow], fmt: FormatType) -> str:
    """What `spend report` prints: the API's JSON reply (`report_body`) or its CSV,
    newline-terminated either way."""
    data = [report_row(row) for row in rows]
    if fmt == "json":
        return json.dumps(report_body(query, rows, data), indent=2) + "\n"
    return csv_text(data, [*check_group_by(query.group_by), *COLUMNS])
