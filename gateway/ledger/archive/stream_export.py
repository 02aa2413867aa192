"""One event stream's export: its consumer group, its lease, and one batch at a time.

A batch goes: read (this consumer's pending entries first, left by a crash or a failed
ack, or claimed from a previous holder; else new entries, gathered for up to `flush_s`
or `batch_max` entries) -> commit to files (`commit`: durable, and only what no file
covers yet) -> ack (`group`: acked, deleted and counted in one script), so a crash
anywhere leaves each entry either pending (and the next commit finds whether it is on
disk already) or archived.

New entries are committed only if this consumer's pending list is exactly the batch:
a read whose reply was lost still delivered its page to the pending list, and a batch
read around that gap would make a file whose range claims entries it lacks. The
client must not retry reads (`build.archive_client`) for the same reason.
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
from gateway.ledger.archive.group import (
    ACK_CHUNK,
    ACK_LUA,
    GROUP,
    RawEntry,
    pending_is,
    read_page,
)
from gateway.ledger.archive.layout import stream_slug
from gateway.ledger.archive.lease import Claim, Lease
from gateway.ledger.archive.schema import row_of
from gateway.ledger.archive.stats import StreamStats, baseline, stream_stats
from gateway.ledger.archive.worker import FileWorker
from gateway.ledger.stream_ids import parse_id
from gateway.redis_client import RedisClient

log = logging.getLogger(__name__)

Tick = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class ArchiveOptions:
    batch_max: int = 20_000  # entries per batch (and at most per file)
    # Entries per XREADGROUP reply, which is parsed on the event loop (~3.5 ms for 200
    # without hiredis): small in a gateway, whose requests share the loop.
    read_count: int = 200
    flush_s: float = 60.0  # how long new entries gather before they are written
    poll_s: float = 0.5  # wait between reads of an idle stream, and for a held lease
    lease_ttl_s: float = 30.0
    stats_s: float = 5.0  # how often the backlog and dropped figures are read
    retry_s: float = 2.0  # wait after an error (Redis away, a full disk)
    # Merge the closed days' files once a UTC day (`compact`), by the holder of the
    # first stream: the gateway and `spend export` turn it on.
    compact: bool = False


class StreamExport:
    """The export of the stream `key` into `root`, by the consumer `token`."""

    def __init__(
        self,
        client: RedisClient,
        key: str,
        root: Path,
        options: ArchiveOptions,
        token: str,
        worker: FileWorker | None = None,
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
        self._ack = client.register_script(ACK_LUA)
        self._worker = worker or FileWorker()

    async def take_over(self) -> None:
        """Become the group's only consumer (the lease is held): make the group if it is
        missing, claim every pending entry, drop idle consumers, clear unfinished
        commits' temporary files."""
        await self._ensure_group()
        cursor, lost = "0-0", 0
        while True:
            cursor, _, deleted = await self._client.xautoclaim(
                self.key, GROUP, self.token, 0, cursor, count=self.options.read_count
            )
            lost += len(deleted)
            if cursor == "0-0":
                break
        if lost:
            log.warning("%d pending entries of %s were trimmed before export", lost, self.key)
        for consumer in await self._client.xinfo_consumers(self.key, GROUP):
            if consumer["name"] != self.token and not consumer["pending"]:
                await self._client.xgroup_delconsumer(self.key, GROUP, consumer["name"])
        removed = await self._worker.run(self._remove_temps)
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
            if raw and not await pending_is(self._client, self.key, self.token, raw):
                log.warning(
                    "%s: the pending entries are not the batch read (a reply lost?); "
                    "dropping it to read the pending entries first",
                    self.key,
                )
                return 0, False
        archived = await self._commit(raw) if raw else 0
        return archived, caught_up

    async def stats(self) -> StreamStats:
        return await stream_stats(
            self._client, self.key, GROUP, self.archived_key, self.baseline_key
        )

    async def _ensure_group(self) -> None:
        try:
            await self._client.xgroup_create(self.key, GROUP, id="0", mkstream=True)
            log.info("created the archive's consumer group on %s", self.key)
        except redis_errors.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise
        # Whether or not this call made the group: one whose reply was lost made it, and
        # without a baseline every entry lost before the archive would count as dropped.
        # Nothing is read before the baseline is there, so it is still right.
        if not await self._client.exists(self.baseline_key):
            lost_before = await baseline(self._client, self.key)
            await self._client.set(self.baseline_key, lost_before, nx=True)

    async def _read(self, start: str, count: int) -> list[RawEntry]:
        return await read_page(self._client, self.key, self.token, start, count)

    async def _read_pending(self) -> list[RawEntry]:
        """This consumer's pending entries, oldest first (up to `batch_max`)."""
        found: list[RawEntry] = []
        start = "0"
        while len(found) < self.options.batch_max:
            wanted = min(self.options.read_count, self.options.batch_max - len(found))
            page = await self._read(start, wanted)
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
            wanted = min(self.options.read_count, self.options.batch_max - len(batch))
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
            if self.lease.due():
                await self._renew("while gathering a batch")
            await tick()
            await pause(stopping, min(self.options.poll_s, left))
        return batch, False

    async def _renew(self, doing: str) -> None:
        """Renew the lease, or raise LeaseLost (dropping the batch in hand): another holds
        it, or it lapsed and was taken afresh, when another may have held it meanwhile
        and claimed this consumer's entries; the next turn takes over again."""
        claim = await self.lease.claim()
        if claim is Claim.RENEWED:
            return
        self.holding = False
        if claim is Claim.TAKEN:
            raise LeaseLost(f"its lease lapsed {doing}; taking the stream over again")
        raise LeaseLost(f"its lease was lost {doing}; another exporter takes over")

    async def _commit(self, raw: Sequence[RawEntry]) -> int:
        entries = await self._worker.run(self._entries, raw)
        await self._renew("before a commit")  # renewed just before the files appear
        margin = self.options.lease_ttl_s / 3
        outcome: Outcome = await self._worker.run(
            commit,
            self.root,
            self.slug,
            entries,
            lambda: self.lease.valid(margin),
            self._worker.stopping,
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
        with directory_lock(self.root, lambda: not self._worker.stopping()):
            return remove_temps(self.root)


async def pause(stopping: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if the exporter is stopping."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stopping.wait(), seconds)
