"""The in-process ledger store: the embedded default, and the contract's reference.

Every method body runs without an `await` in the middle, so each call is atomic on
the event loop and concurrent `record` calls need no lock. It is not thread-safe and
not shared between worker processes; production deployments use `RedisStore`.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from datetime import date

from gateway.ledger.record import DIMENSIONS, AggregateRow, SpendRecord
from gateway.ledger.rollup import GROUPABLE, METRICS, Rollup, check_group_by, metrics_of
from gateway.ledger.store import DEDUPE_WINDOW_S

# (day, team, key, route, tier, deployment, model): the finest grain kept.
_Cell = tuple[str, ...]


class MemoryStore:
    """A `LedgerStore` in a dict and a deque.

    Aggregates are kept per (day, dimensions) cell, so memory grows with the number
    of distinct cells, not requests. Records are kept for `get` and de-duplication
    for `dedupe_ttl_s` (like `RedisStore`), then forgotten; the event log keeps the
    last `stream_maxlen` records.

    >>> store = MemoryStore(); await store.record(rec)
    """

    def __init__(self, stream_maxlen: int = 100_000, dedupe_ttl_s: float = DEDUPE_WINDOW_S) -> None:
        if stream_maxlen < 1:
            raise ValueError(f"stream_maxlen is {stream_maxlen}; it must be at least 1")
        self._dedupe_ttl_s = dedupe_ttl_s
        # record_id -> (monotonic time recorded, record); insertion order is time order.
        self._records: dict[str, tuple[float, SpendRecord]] = {}
        self._events: deque[SpendRecord] = deque(maxlen=stream_maxlen)
        self._cells: dict[_Cell, list[int]] = {}

    async def record(self, rec: SpendRecord) -> bool:
        """Add `rec` once; False (and no change) if its `record_id` was seen already."""
        now = time.monotonic()
        self._forget_before(now - self._dedupe_ttl_s)
        if rec.record_id in self._records:
            return False
        self._records[rec.record_id] = (now, rec)
        self._events.append(rec)
        cell = (rec.day, *(rec.dimension(name) for name in DIMENSIONS))
        totals = self._cells.setdefault(cell, [0] * len(METRICS))
        for i, amount in enumerate(metrics_of(rec)):
            totals[i] += amount
        return True

    async def record_many(self, recs: Sequence[SpendRecord]) -> list[bool]:
        return [await self.record(rec) for rec in recs]

    async def get(self, record_id: str) -> SpendRecord | None:
        entry = self._records.get(record_id)
        return None if entry is None else entry[1]

    async def aggregate(
        self, day_from: date, day_to: date, group_by: Sequence[str]
    ) -> list[AggregateRow]:
        """Totals for days in [day_from, day_to] (UTC, inclusive), one row per group."""
        names = check_group_by(group_by)
        picks = [GROUPABLE.index(name) for name in names]
        low, high = day_from.isoformat(), day_to.isoformat()
        rollup = Rollup(names)
        for cell, totals in self._cells.items():
            if low <= cell[0] <= high:
                rollup.add(tuple(cell[i] for i in picks), totals)
        return rollup.rows()

    async def events(self, limit: int = 1000) -> list[SpendRecord]:
        """The latest `limit` records, oldest first."""
        if limit <= 0:
            return []
        return list(self._events)[-limit:]

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None

    def _forget_before(self, cutoff: float) -> None:
        while self._records:
            record_id, (recorded_at, _) = next(iter(self._records.items()))
            if recorded_at >= cutoff:
                return
            del self._records[record_id]
