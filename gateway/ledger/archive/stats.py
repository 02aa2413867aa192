"""How far behind the archive is, and what it missed, read from Redis.

Every entry ever added to a stream (XINFO STREAM's `entries-added`, Redis >= 7) is, at
any moment, exactly one of:

    before     gone before the archive's group existed (`baseline`, set with the group)
    archived   acked by the exporter, counted by the same script that acks and deletes
               it (`archived`), so the count is exact across crashes and takeovers
    pending    delivered to the exporter and not acked yet (XPENDING)
    unread     in the stream, not delivered yet: the stream's length less the pending
               entries still in it (the exporter deletes what it acks, so no other
               entry is)
    dropped    trimmed by MAXLEN before it was archived

so `dropped = entries-added - before - archived - pending - unread`, whatever Redis's
own read counters make of a trimmed stream. The backlog is `pending + unread`: what
the archive does not have yet, and what MAXLEN will start dropping as it nears the cap.
Trimming removes the oldest entries, so pending entries are all still in the stream
unless the oldest pending one is older than the stream's first entry; only then are they
counted one by one.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.ledger.stream_ids import parse_id
from gateway.redis_client import RedisClient


@dataclass(frozen=True, slots=True)
class StreamStats:
    length: int  # entries in the stream
    pending: int  # delivered to the exporter, not archived yet
    backlog: int  # not archived yet: pending and unread
    dropped: int | None  # trimmed before they were archived; None before Redis 7


async def stream_stats(
    client: RedisClient, stream: str, group: str, archived_key: str, baseline_key: str
) -> StreamStats:
    """The stream's figures; raises redis's ResponseError when the group does not exist."""
    async with client.pipeline(transaction=True) as pipe:  # one consistent snapshot
        pipe.xinfo_stream(stream)
        pipe.xpending(stream, group)
        pipe.get(archived_key)  # not MGET: a cluster pipeline refuses it
        pipe.get(baseline_key)
        info, summary, *counters = await pipe.execute()
    pending = int(summary["pending"])
    in_stream = pending
    first = info.get("first-entry")
    if pending and first is None:
        in_stream = 0
    elif pending and parse_id(summary["min"]) < parse_id(first[0]):
        # Some pending entries were trimmed: count those still there.
        in_stream = len(await client.xpending_range(stream, group, first[0], "+", pending))
    length = int(info["length"])
    backlog = pending + length - in_stream
    added = info.get("entries-added")
    dropped = None
    if added is not None:
        archived, before = (int(value or 0) for value in counters)
        dropped = max(0, int(added) - before - archived - backlog)
    return StreamStats(length=length, pending=pending, backlog=backlog, dropped=dropped)


async def baseline(client: RedisClient, stream: str) -> int:
    """Entries the stream has lost already (added less those still in it): the
    `before` of an archive starting now."""
    info = await client.xinfo_stream(stream)
    return max(0, int(info.get("entries-added", info["length"])) - int(info["length"]))
