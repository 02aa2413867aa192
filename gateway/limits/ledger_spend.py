"""Where a budget's period starts: the ledger's spend in it so far.

The limits store counts a budget from the first admission of its period on. A budget
added to the policy mid-period, or a period whose counters were lost, would otherwise be
enforced from $0 while the budget report (`gateway.spend.budgets`, the ledger's whole
period) shows what was really spent: a team could overspend a hard limit by what it
spent before the budget appeared. So each worker reads the ledger's figures per scope
and period while a budget of it is unseeded (`gateway.limits.seeds`) and offers them
with its admissions (`Ask.seeds`); the admission script takes a budget's once per
period's counters, as the larger of it and what they hold (counters created without a
seed hold only spend settled since, which the ledger has too): nothing is counted twice.

What the seed misses or repeats, by design: records not in the ledger yet when it is
read (in flight, queued, spooled) are not in it; a request admitted at the end of one
period and finished in the next is charged to the first and seeds the second (the
report counts it there too); and a request served unchecked during a Redis outage that
begins a period, in the seed and settled only after it was taken, is counted twice
(erring towards refusal, never overspend).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import date
from typing import Protocol

from gateway.ledger import AggregateRow, LedgerLayoutError, LedgerUnavailable
from gateway.limits.rules import Period

log = logging.getLogger(__name__)


class Aggregates(Protocol):
    """What is read: a `LedgerStore` or the gateway's `CostLedger`."""

    async def aggregate(
        self, day_from: date, day_to: date, group_by: Sequence[str]
    ) -> list[AggregateRow]: ...


class LedgerSpend:
    """The spend of every budget of a scope in a period so far, from the ledger's daily
    aggregates: one read serves every key's (team's, route's) budget.

    >>> spent = await LedgerSpend(store)("team", period)  # {name: nano-USD}; None: unreadable
    """

    def __init__(self, store: Aggregates) -> None:
        self._store = store

    async def __call__(self, scope: str, period: Period) -> dict[str, int] | None:
        """Its days yet to come have no spend: the whole period is read."""
        try:
            rows = await self._store.aggregate(period.first_day, period.last_day, [scope])
        except (LedgerUnavailable, LedgerLayoutError) as exc:
            log.warning(
                "%s budgets start %s from what settles, not the ledger's spend (read "
                "again in a while): %s",
                scope,
                period.id,
                exc,
            )
            return None
        spend: Counter[str] = Counter()
        for row in rows:
            spend[row.group[scope]] += row.cost_nanos
        return dict(spend)
