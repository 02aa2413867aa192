"""One event stream's export: its consumer group, its lease, and one batch at a time.

A batch goes: read (this consumer's pending entries first, left by a crash or a failed
ack, or claimed from a previous holder; else new entries, gathered for up to `flush_s`
or `batch_max` entries) -> commit to files (`commit`: durable, and only what no file
covers yet) -> ack. The ack is one script per chunk of ids: XACK, XDEL of the same ids
(the stream keeps only what is not archived) and the `archived` count, together, so a
crash anywhere leaves each entry either pending (and the next commit finds whether it
is on disk already) or acked, deleted and counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from redis import exceptions as redis_errors

from gateway.ledger.archive.commit import Entry, LeaseLost, Outcome, commit
from gateway.ledger.archive.files import directory_lock, remove_temps
from gateway.ledger.archive.layout import parse_id, stream_slug
from gateway.ledger.archive.lease import Lease
from gateway.ledger.archive.schema import row_of
from gateway.ledger.archive.stats import StreamStats, baseline, stream_stats
from gateway.redis_client import RedisClient

log = logging.getLogger(__name__)

GROUP = "archive"
READ_COUNT = 1000  # entries per XREADGROUP: each reply is parsed on the event loop
ACK_CHUNK = 1000  # ids per ack script (Lua's unpack takes a few thousand at most)

RawEntry = tuple[str, dict[str, str] | None]
Tick = Callable[[], Awaitable[None]]

# KEYS: 1 stream, 2 archived counter. ARGV: 1 group, 2 n, 3.. ids: the first n were
# archived, the rest had lost their content. Returns how many of the n were pending.
_ACK_LUA = """
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


@dataclass(frozen=True, slots=True)
class ArchiveOptions:
    batch_max: int = 20_000  # entries per batch (and at most per file)
    flush_s: float = 60.0  # how long new entries gather before they are written
    poll_s: float = 0.5  # wait between reads of an idle stream, and for a held lease
    lease_ttl_s: float = 30.0
    stats_s: float = 5.0  # how often the backlog and dropped figures are read
    retry_s: float = 2.0  # wait after an error (Redis away, a full disk)


class StreamExport:
    """The export of the stream `key` into `root`, by the consumer `token`."""

    def __init__(
        self, client: RedisClient, key: str, root: Path, options: ArchiveOptions, token: str
    ) -> None:
        self.key = key
        self.slug = stream_slug(key)
        self.root = root
        self.options = options
        self.token = token
        self.lease = Lease(client, f"{key}:archive:lease", token, options.lease_ttl_s)
        self.archived_key = f"{key}:archive:archived"
        self.baseline_key = f"{key}:archive:baseline"
        self.holding = False  # took over since it last held the lease
        self._client = client
        self._ack = client.register_script(_ACK_LUA)

    async def take_over(self) -> None:
        """Become the group's only consumer (the lease is held): make the group if it is
        missing, claim every pending entry, drop idle consumers, clear unfinished
        commits' temporary files."""
        await self._ensure_group()
        cursor, lost = "0-0", 0
        while True:
            cursor, _, deleted = await self._client.xautoclaim(
                self.key, GROUP, self.token, 0, cursor, count=READ_COUNT
            )
            lost += len(deleted)
            if cursor == "0-0":
                break
        if lost:
            log.warning("%d pending entries of %s were trimmed before export", lost, self.key)
        for consumer in await self._client.xinfo_consumers(self.key, GROUP):
            if consumer["name"] != self.token and not consumer["pending"]:
                await self._client.xgroup_delconsumer(self.key, GROUP, consumer["name"])
        removed = await asyncio.to_thread(self._remove_temps)
        if removed:
            log.info("removed %d unfinished archive file(s) under %s", removed, self.root)
        self.holding = True

    async def step(
        self, stopping: asyncio.Event, tick: Tick, drain: bool = False
    ) -> tuple[int, bool]:
        """One batch; returns (entries archived, whether the stream is read to its end).
        `drain`: take what is there now, without waiting for more."""
        raw = await self._read_pending()
        caught_up = False
        if not raw:
            raw, caught_up = await self._gather(stopping, tick, drain)
        archived = await self._commit(raw) if raw else 0
        return archived, caught_up

    async def stats(self) -> StreamStats:
        return await stream_stats(
            self._client, self.key, GROUP, self.archived_key, self.baseline_key
        )

    async def _ensure_group(self) -> None:
        try:
            await self._client.xgroup_create(self.key, GROUP, id="0", mkstream=True)
        except redis_errors.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
            return
        await self._client.set(self.baseline_key, await baseline(self._client, self.key), nx=True)
        log.info("created the archive's consumer group on %s", self.key)

    async def _read(self, start: str, count: int) -> list[RawEntry]:
        reply: Any = await self._client.xreadgroup(
            GROUP, self.token, {self.key: start}, count=count
        )
        if not reply:
            return []
        if isinstance(reply, dict):  # RESP3
            return list(next(iter(reply.values()))[0])
        return list(reply[0][1])

    async def _read_pending(self) -> list[RawEntry]:
        """This consumer's pending entries, oldest first (up to `batch_max`)."""
        found: list[RawEntry] = []
        start = "0"
        while len(found) < self.options.batch_max:
            page = await self._read(start, min(READ_COUNT, self.options.batch_max - len(found)))
            if not page:
                break
            found += page
            start = page[-1][0]
        return found

    async def _gather(
        self, stopping: asyncio.Event, tick: Tick, drain: bool
    ) -> tuple[list[RawEntry], bool]:
        batch: list[RawEntry] = []
        deadline: float | None = None
        while len(batch) < self.options.batch_max and not stopping.is_set():
            wanted = min(READ_COUNT, self.options.batch_max - len(batch))
            page = await self._read(">", wanted)
            batch += page
            if len(page) == wanted:
                continue
            if drain:
                return batch, True
            if not batch:  # an idle stream: back to the caller after a pause
                await tick()
                await pause(stopping, self.options.poll_s)
                return batch, True
            deadline = deadline or time.monotonic() + self.options.flush_s
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if self.lease.due() and not await self.lease.claim():
                raise LeaseLost(f"lease on {self.key} lost while gathering a batch")
            await tick()
            await pause(stopping, min(self.options.poll_s, left))
        return batch, False

    async def _commit(self, raw: Sequence[RawEntry]) -> int:
        entries = await asyncio.to_thread(self._entries, raw)
        if not await self.lease.claim():  # renewed just before the files appear
            raise LeaseLost(f"lease on {self.key} lost before a commit")
        margin = self.options.lease_ttl_s / 3
        outcome: Outcome = await asyncio.to_thread(
            commit, self.root, self.slug, entries, lambda: self.lease.valid(margin)
        )
        if outcome.covered or outcome.lost:
            log.warning(
                "%s: %d entries were archived already (a commit cut short), %d had lost "
                "their content; acking them",
                self.key,
                outcome.covered,
                outcome.lost,
            )
        return await self._acknowledge(entries)

    async def _acknowledge(self, entries: Sequence[Entry]) -> int:
        archived = 0
        for i in range(0, len(entries), ACK_CHUNK):
            chunk = entries[i : i + ACK_CHUNK]
            kept = [e.id for e in chunk if e.row is not None]
            gone = [e.id for e in chunk if e.row is None]
            args: list[Any] = [GROUP, len(kept), *kept, *gone]
            archived += int(await self._ack(keys=[self.key, self.archived_key], args=args))
        return archived

    def _entries(self, raw: Sequence[RawEntry]) -> list[Entry]:
        return [
            Entry(entry_id, parse_id(entry_id), row_of(self.key, entry_id, row) if row else None)
            for entry_id, row in raw
        ]

    def _remove_temps(self) -> int:
        with directory_lock(self.root):
            return remove_temps(self.root)


async def pause(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if the exporter is stopping."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)
