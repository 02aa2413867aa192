"""Where a budget's period starts: the ledger's spend in it so far.

The limits store counts a budget from the first admission of its period on. A budget
added to the policy mid-period, or a period whose counters were lost, would otherwise
be enforced from $0 while the budget report (`gateway.spend.budgets`, the ledger's
whole period) shows what was really spent: a team could overspend a hard limit by what
it spent before the budget appeared. So each worker reads the ledger's figure once per
budget and period and offers it with its admissions (`Ask.seeds`); the admission
script takes it only where the budget has no counters yet in the period, i.e. before
anything was admitted or settled there. The ledger read comes before that script, so
it holds no request charged to the budget: nothing is counted twice.

What the seed misses or repeats, by design: records not in the ledger yet when it is
read (in flight, queued, spooled) are not in it; a request admitted at the end of one
period and finished in the next is charged to the first and seeds the second (the
report counts it there too); and a request served unchecked during a Redis outage that
begins a period is in the seed and settles on top of it when Redis is back (counted
twice, erring towards refusal, never overspend).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import date
from typing import Protocol

from gateway.ledger import AggregateRow, LedgerLayoutError, LedgerUnavailable
from gateway.limits.rules import BudgetRule, Period

log = logging.getLogger(__name__)


class Aggregates(Protocol):
    """What is read: a `LedgerStore` or the gateway's `CostLedger`."""

    async def aggregate(
        self, day_from: date, day_to: date, group_by: Sequence[str]
    ) -> list[AggregateRow]: ...


class LedgerSpend:
    """A budget's spend in its period so far, from the ledger's daily aggregates.

    >>> spent = await LedgerSpend(store)(budget, period)  # nano-USD; None: unreadable
    """

    def __init__(self, store: Aggregates) -> None:
        self._store = store

    async def __call__(self, budget: BudgetRule, period: Period) -> int | None:
        """Its days yet to come have no spend: the whole period is read."""
        try:
            rows = await self._store.aggregate(period.first_day, period.last_day, [budget.scope])
        except (LedgerUnavailable, LedgerLayoutError) as exc:
            log.warning(
                "%s starts %s from what settles, not the ledger's spend: %s",
                budget.label,
                period.id,
                exc,
            )
            return None
        return sum(row.cost_nanos for row in rows if row.group[budget.scope] == budget.name)
