"""SLA attainment per route, from the ledger's `sla_met` / `sla_missed` counters.

Each record on a route with an SLA was judged when it was written (see
`gateway.runtime.sla_met`): a stream by its first token against `ttft_ms`, a whole
answer against `timeout_ms`. Attainment is met / (met + missed); records judged
against no target do not count either way.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from datetime import date
from typing import Any

from gateway.spend.report import Aggregates, aggregate, percent
from policies.schema import Route

COLUMNS = (
    "route",
    "ttft_ms",
    "timeout_ms",
    "requests",
    "sla_requests",
    "sla_met",
    "sla_missed",
    "attainment_pct",
)
# Why a report has no rows: it lists every route with an SLA, and any judged in range.
NO_SLA_NOTE = (
    "no route in the policy has an SLA (routes.<name>.sla), "
    "and no request in this range was judged against one"
)


async def sla_report(
    store: Aggregates,
    day_from: date,
    day_to: date,
    routes: Mapping[str, Route],
    teams: Collection[str] | None = None,
) -> list[dict[str, Any]]:
    """One row per route that has an SLA in the policy or judged records in the range."""
    rows = {
        row.group["route"]: row
        for row in await aggregate(store, day_from, day_to, ["route"], teams)
    }
    names = sorted(
        {name for name, route in routes.items() if route.sla}
        | {name for name, row in rows.items() if row.sla_met + row.sla_missed}
    )
    report = []
    for name in names:
        sla = routes[name].sla if name in routes else None
        row = rows.get(name)
        met, missed = (row.sla_met, row.sla_missed) if row else (0, 0)
        judged = met + missed
        report.append(
            {
                "route": name,
                "ttft_ms": sla.ttft_ms if sla else None,
                "timeout_ms": sla.timeout_ms if sla else None,
                "requests": row.requests if row else 0,
                "sla_requests": judged,
                "sla_met": met,
                "sla_missed": missed,
                "attainment_pct": percent(met, judged),
            }
        )
    return report
