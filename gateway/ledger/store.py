"""The interface every ledger store implements (Redis, in-memory).

Contract (tests/gateway/test_ledger_contract.py runs it against each store):
- `record` is idempotent on `record_id`: the first call counts, later ones return False
  and change nothing. Aggregates and the event stream are updated atomically with it.
- `aggregate` sums records whose day lies in [day_from, day_to] (UTC, inclusive),
  grouped by any subset of DIMENSIONS plus "day"; an empty `group_by` gives one total row.
- `events` returns recorded events oldest first (bounded by the store's retention).
- Connection failures raise `LedgerUnavailable` (never a foreign exception), so the
  caller can spool and replay.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Protocol

from gateway.ledger.record import AggregateRow, SpendRecord

# How long a record's exactly-once marker lives (`Settings.ledger_dedupe_window_s`).
DEDUPE_WINDOW_S = 48 * 3600


class LedgerUnavailable(Exception):
    """The store cannot be reached; the record was not written."""


class LedgerStore(Protocol):
    async def record(self, rec: SpendRecord) -> bool: ...

    async def record_many(self, recs: Sequence[SpendRecord]) -> list[bool]:
        """`record` for each record, in order; one round trip where the store allows."""
        ...

    async def get(self, record_id: str) -> SpendRecord | None: ...

    async def aggregate(
        self, day_from: date, day_to: date, group_by: Sequence[str]
    ) -> list[AggregateRow]: ...

    async def events(self, limit: int = 1000) -> list[SpendRecord]: ...

    async def ping(self) -> bool: ...

    async def close(self) -> None: ...
