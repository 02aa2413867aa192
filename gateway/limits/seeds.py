"""Where each budget's period starts, as one worker offers it (`Ask.seeds`): the
ledger's spend in the period (`gateway.limits.ledger_spend`).

    ask = dataclasses.replace(ask, seeds=await seeds.offer(ask.budgets, ask.periods, now))
    verdict = await store.admit(ask)
    seeds.note(ask, verdict)

The ledger is read once per scope and period (one read holds every key's, team's or
route's spend) and shared by all budgets of that scope; requests that arrive while it
is under way wait on the same read, which their cancellation does not cancel. A
budget's seed is offered until an admission has given it to the budget's counters
(the script merges it into counters created without one, `ADMIT_LUA`); then -1.

A read serves for `FRESH_S` after it began; a budget not seeded yet then asks for a new
one, so a budget added by a reload (or counters lost to Redis) is seeded from the
ledger's spend of the last half minute, not from a read of weeks ago. A read that fails
offers none (-1): a transient failure costs a few admissions' seeds, not the period's.
An admission that reports a seeded budget's counters unseeded (lost, then created again
from what settled since) reads the ledger again and re-offers the seed.
A period's entries are forgotten when it ends (a month's at month end).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence

from gateway.limits.rules import BudgetRule, Period
from gateway.limits.store import Admitted, Ask, RateRefusal, Verdict

log = logging.getLogger(__name__)

FRESH_S = 30.0  # a read of the ledger serves this long after it began (failed or not)
NONE = -1  # no seed offered
# A scope's spend in a period by budget name, as the ledger has it; None: unreadable.
Spend = Mapping[str, int] | None
SpendReader = Callable[[str, Period], Awaitable[Spend]]


class Seeds:
    """One worker's seeds: the ledger's reads per (scope, period) and the budgets seeded."""

    def __init__(self, read: SpendReader) -> None:
        self._read = read
        # (scope, period id) -> when the read began, and the read
        self._reads: dict[tuple[str, str], tuple[float, asyncio.Task[Spend]]] = {}
        self._seeded: set[tuple[str, str, str]] = set()  # (scope, name, period id)
        self._ends: dict[str, float] = {}  # period id -> when it ends
        self._next_end = math.inf

    async def offer(
        self, budgets: Sequence[BudgetRule], periods: Sequence[Period], now: float
    ) -> tuple[int, ...]:
        """Each budget's seed in its period: the ledger's figure, or `NONE` where it is
        seeded already or the ledger cannot be read."""
        if now >= self._next_end:
            self._forget(now)
        seeds = []
        for budget, period in zip(budgets, periods, strict=True):
            if (budget.scope, budget.name, period.id) in self._seeded:
                seeds.append(NONE)
                continue
            spend = await self._spend(budget.scope, period, now)
            seeds.append(NONE if spend is None else spend.get(budget.name, 0))
        return tuple(seeds)

    def note(self, ask: Ask, verdict: Verdict) -> None:
        """What `verdict` seeded: every budget offered a seed (the script merges it
        before checking any budget), unless a rate limit refused first. A seeded budget
        that an admission found unseeded has lost its counters: its seed is read again."""
        if not ask.seeds or isinstance(verdict, RateRefusal):
            return
        for budget, period, seed in zip(ask.budgets, ask.periods, ask.seeds, strict=True):
            if seed >= 0 and period.id in self._ends:  # not forgotten meanwhile
                self._seeded.add((budget.scope, budget.name, period.id))
        if not isinstance(verdict, Admitted) or not verdict.unseeded:
            return
        for budget, period, unseeded in zip(
            ask.budgets, ask.periods, verdict.unseeded, strict=True
        ):
            key = (budget.scope, budget.name, period.id)
            if unseeded and key in self._seeded:
                log.warning("%s lost its counters for %s: seeding them again", budget.label, key[2])
                self._seeded.discard(key)
                self._reads.pop((budget.scope, period.id), None)  # stale now

    async def _spend(self, scope: str, period: Period, now: float) -> Spend:
        key = (scope, period.id)
        began, task = self._reads.get(key, (-math.inf, None))
        if task is None or now - began >= FRESH_S:
            task = asyncio.ensure_future(self._read_once(scope, period))
            self._reads[key] = (now, task)
            self._ends[period.id] = period.ends_at
            self._next_end = min(self._next_end, period.ends_at)
        # Shielded: a request cancelled while it waits must not cancel the others' read.
        return await asyncio.shield(task)

    async def _read_once(self, scope: str, period: Period) -> Spend:
        try:
            return await self._read(scope, period)
        except Exception:  # a bug in the read must not fail every admission waiting on it
            log.exception("reading the ledger's %s spend for %s failed", scope, period.id)
            return None

    def _forget(self, now: float) -> None:
        """Drop the entries of the periods that have ended."""
        ended = {period for period, ends_at in self._ends.items() if ends_at <= now}
        self._reads = {k: read for k, read in self._reads.items() if k[1] not in ended}
        self._seeded = {k for k in self._seeded if k[2] not in ended}
        self._ends = {period: at for period, at in self._ends.items() if period not in ended}
        self._next_end = min(self._ends.values(), default=math.inf)
