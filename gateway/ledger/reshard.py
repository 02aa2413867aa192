"""Moving a one-slot ledger (`{ledger}`, a single Redis's layout) onto N shards, for a
move to a Redis Cluster: `cascade-gateway spend reshard --shards N`, gateways stopped.

- Each record's marker (`rec:<id>`, the exactly-once guard) goes to its shard
  (`shard_of(id, N)`) with the time it has left: a replay after the move still meets it.
- The daily aggregates (every day hash, its dimension hashes, the days set) go to shard
  0 whole, with their expiries: reads sum the N shards, so the totals stay the same.
- The events stream's entries go to shard 0's stream under their own ids (the audit
  trail keeps its times). A stream the archive exports must be drained first (`spend
  export --once`): entries it has read but not archived would be lost to it.
- Then `P{ledger}:shards` records N. Every step copies, then deletes the original, so a
  move cut short can be run again: what moved is not there to move twice, and a copy
  whose original is still there is written again with the same content.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.ledger.archive.group import GROUP
from gateway.ledger.shards import ShardKeys, layout_key, shard_of

SCAN_COUNT = 1000
STREAM_PAGE = 1000


class ReshardRefused(Exception):
    """The ledger cannot be moved as it is (said why)."""


@dataclass
class Moved:
    markers: int = 0
    day_keys: int = 0
    events: int = 0


async def reshard(client: Any, prefix: str, shards: int) -> Moved:
    """Move the one-slot ledger under `prefix` onto `shards` shards (see the module);
    with one shard, check that it is still in one slot and move nothing."""
    if shards < 1:
        raise ReshardRefused(f"--shards must be 1 or more, not {shards}")
    recorded = await client.get(layout_key(prefix))
    if recorded is not None and int(recorded) != shards:
        raise ReshardRefused(f"the ledger under {prefix!r} has {int(recorded)} shards already")
    if shards == 1:
        return Moved()
    old, targets = ShardKeys(prefix, 0, 1), [ShardKeys(prefix, k, shards) for k in range(shards)]
    await _check_drained(client, old.events)
    moved = Moved()
    moved.markers = await _move_markers(client, old, targets, shards)
    moved.day_keys = await _move_days(client, old, targets[0])
    moved.events = await _move_events(client, old.events, targets[0].events)
    await client.set(layout_key(prefix), shards)
    return moved


async def _check_drained(client: Any, stream: str) -> None:
    if not await client.exists(stream):
        return
    groups = {g["name"]: g for g in await client.xinfo_groups(stream)}
    archive = groups.get(GROUP) or groups.get(GROUP.encode())
    if archive is None:
        return
    behind = int(archive.get("lag") or 0) + int(archive.get("pending") or 0)
    if behind:
        raise ReshardRefused(
            f"{stream} has {behind} record(s) the archive has not written yet: run "
            "`cascade-gateway spend export --archive DIR --once` first"
        )


async def _move_markers(client: Any, old: ShardKeys, targets: list[ShardKeys], shards: int) -> int:
    moved = 0
    start = len(old.rec(""))
    async for key in client.scan_iter(match=_glob(old.rec("")) + "*", count=SCAN_COUNT):
        name = key.decode() if isinstance(key, bytes) else key
        record_id = name[start:]
        value, ttl_ms = await client.get(name), await client.pttl(name)
        if value is None or ttl_ms == -2:  # expired meanwhile
            continue
        target = targets[shard_of(record_id, shards)].rec(record_id)
        await client.set(target, value, px=ttl_ms if ttl_ms > 0 else None)
        await client.delete(name)
        moved += 1
    return moved


async def _move_days(client: Any, old: ShardKeys, target: ShardKeys) -> int:
    moved = 0
    day_prefix = old.day("")
    async for key in client.scan_iter(match=_glob(day_prefix) + "*", count=SCAN_COUNT):
        name = key.decode() if isinstance(key, bytes) else key
        fields, ttl_ms = await client.hgetall(name), await client.pttl(name)
        destination = target.day("") + name[len(day_prefix) :]
        if fields and ttl_ms != -2:  # -2: expired between the two reads
            await client.hset(destination, mapping=fields)
            if ttl_ms > 0:
                await client.pexpire(destination, ttl_ms)
        await client.delete(name)
        moved += 1
    days = await client.zrange(old.days, 0, -1, withscores=True)
    if days:
        await client.zadd(target.days, dict(days))
        ttl_ms = await client.pttl(old.days)
        if ttl_ms > 0:
            await client.pexpire(target.days, ttl_ms)
    await client.delete(old.days)
    return moved


async def _move_events(client: Any, stream: str, target: str) -> int:
    moved = 0
    start = "-"
    while True:
        page = await client.xrange(stream, min=start, max="+", count=STREAM_PAGE)
        if not page:
            break
        for entry_id, fields in page:
            try:
                await client.xadd(target, fields, id=entry_id)
            except Exception as exc:  # already copied by a move cut short
                if "equal or smaller" not in str(exc):
                    raise
            moved += 1
        last = page[-1][0]
        start = "(" + (last.decode() if isinstance(last, bytes) else last)
    for suffix in ("", ":archive:lease", ":archive:archived", ":archive:baseline"):
        await client.delete(stream + suffix)
    return moved


def _glob(text: str) -> str:
    """`text` as a literal SCAN pattern (the tag's braces and any of `*?[]\\`)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
