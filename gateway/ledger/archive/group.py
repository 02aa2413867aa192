"""The archive's consumer group on one stream, as Redis commands: reading a page,
checking this consumer's pending entries, acking a committed batch.

The ack is one script per chunk of ids: XACK, XDEL of the same ids (the stream keeps
only what is not archived) and the `archived` count, together, so a crash leaves each
entry either pending or acked, deleted and counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gateway.redis_client import RedisClient

GROUP = "archive"
ACK_CHUNK = 1000  # ids per ack script (Lua's unpack takes a few thousand at most)

RawEntry = tuple[str, dict[str, str] | None]  # None: trimmed after it was delivered

# KEYS: 1 stream, 2 archived counter. ARGV: 1 group, 2 n, 3.. ids: the first n were
# archived, the rest had lost their content. Returns how many of the n were pending.
ACK_LUA = """
local n = tonumber(ARGV[2])
local archived = 0
if n > 0 then
  archived = redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 3, 2 + n))
end
if #ARGV > 2 + n then
  redis.call('XACK', KEYS[1], ARGV[1], unpack(ARGV, 3 + n, #ARGV))
end
redis.call('XDEL', KEYS[1], unpack(ARGV, 3, #ARGV))
if archived > 0 then
  redis.call('INCRBY', KEYS[2], archived)
end
return archived
"""


async def read_page(
    client: RedisClient, key: str, consumer: str, start: str, count: int
) -> list[RawEntry]:
    """Up to `count` entries: `start` ">" for new ones, else this consumer's pending
    entries after the id `start`."""
    reply: Any = await client.xreadgroup(GROUP, consumer, {key: start}, count=count)
    if not reply:
        return []
    if isinstance(reply, dict):  # RESP3
        return list(next(iter(reply.values()))[0])
    return list(reply[0][1])


async def pending_is(
    client: RedisClient, key: str, consumer: str, batch: Sequence[RawEntry]
) -> bool:
    """Whether `consumer`'s pending entries are exactly `batch`, read from new entries:
    each is pending until acked, so the same count, first and last say so."""
    summary: Any = await client.xpending(key, GROUP)
    counts = {c["name"]: int(c["pending"]) for c in summary.get("consumers") or ()}
    if not batch or counts.get(consumer, 0) != len(batch):
        return False
    first, last = batch[0][0], batch[-1][0]
    if len(counts) == 1:  # this consumer's alone: the group's bounds are its own
        return (summary["min"], summary["max"]) == (first, last)
    head = await client.xpending_range(key, GROUP, "-", "+", 1, consumername=consumer)
    tail = await client.xpending_range(key, GROUP, last, "+", 2, consumername=consumer)
    return [entry["message_id"] for entry in head + tail] == [first, last]
