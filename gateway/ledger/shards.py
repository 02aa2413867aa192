"""Where the Redis ledger's keys live: in one slot, or spread over N shards.

With one shard (the default on a single Redis) every key carries the hash tag
`{ledger}`, the documented names. With N > 1 a record goes to shard
`crc32(record_id) % N`, and every key its script touches (marker, day hashes, days,
events) carries the tag `{ledger.K}` of its shard K: a script still touches one slot,
and a Redis Cluster spreads the N slots over its masters. The shard depends on the
record id alone, so a replayed record meets its own marker again.

N is part of the data's layout: a store with another N would read none of the data
and could count a replayed record twice. The first N>1 store on a prefix writes
`P{ledger}:shards` (unless one-shard data is there); every store checks that key once
and refuses to run on a layout that is not its own (`LedgerLayoutError`).
"""

from __future__ import annotations

import functools
import zlib
from datetime import date
from typing import Any

from gateway.ledger.record import DIMENSIONS


class LedgerLayoutError(ValueError):
    """The ledger under this prefix was written with another shard count."""


def shard_of(record_id: str, shards: int) -> int:
    """The shard of a record: stable across processes and restarts (unlike `hash`)."""
    return zlib.crc32(record_id.encode()) % shards


class ShardKeys:
    """The key names of one shard (`P{ledger}:` or `P{ledger.K}:`)."""

    def __init__(self, prefix: str, shard: int, shards: int) -> None:
        tag = "ledger" if shards == 1 else f"ledger.{shard}"
        self.base = f"{prefix}{{{tag}}}:"
        self.days = self.base + "days"
        self.events = self.base + "events"
        self._record_keys: dict[str, tuple[str, ...]] = {}

    def record_keys(self, day: str) -> tuple[str, ...]:
        """The keys a record of `day` adds to besides its marker, in the script's order:
        the day's hashes (all dimensions, then each), the days set, the events stream.
        Kept for the few days a store writes at a time, not built per record."""
        keys = self._record_keys.get(day)
        if keys is None:
            if len(self._record_keys) >= 4:
                self._record_keys.clear()
            dims = (self.day(day, name) for name in DIMENSIONS)
            keys = self._record_keys[day] = (self.day(day), *dims, self.days, self.events)
        return keys

    def rec(self, record_id: str) -> str:
        return self.base + "rec:" + record_id

    def day(self, day: str, dimension: str | None = None) -> str:
        key = f"{self.base}day:{day}"
        return key if dimension is None else f"{key}:{dimension}"


@functools.lru_cache(maxsize=8)
def day_ordinal(day: str) -> int:
    """A `YYYY-MM-DD` day's ordinal, the days set's score."""
    return date.fromisoformat(day).toordinal()


def layout_key(prefix: str) -> str:
    return f"{prefix}{{ledger}}:shards"


async def check_layout(client: Any, prefix: str, shards: int) -> None:
    """Raise `LedgerLayoutError` unless the ledger under `prefix` has `shards` shards.
    The first store with N > 1 records N, unless unsharded data is there already."""
    key = layout_key(prefix)
    found = await client.get(key)
    if found is None and shards > 1 and not await client.exists(ShardKeys(prefix, 0, 1).days):
        await client.set(key, shards, nx=True)
        found = await client.get(key)  # another store's count, if it came first
    recorded = 1 if found is None else int(found)
    if recorded != shards:
        raise LedgerLayoutError(
            f"the ledger under prefix {prefix!r} is spread over {recorded} shard(s), not "
            f"{shards}: set CASCADE_LEDGER_SHARDS={recorded}, or use a new prefix"
        )
