"""The archive exporter: drains the ledger's event streams into Parquet files.

Any number may run (each gateway worker, replicas, a `spend export` sidecar); per
stream, the one holding the stream's lease exports and the others wait, reading the
backlog figures, and take over within a lease's ttl when it stops or dies. Errors (Redis
away, a full disk) are logged once per episode and retried; the background export never
raises for them.

>>> exporter = build_exporter(store, Path("/archive"))   # its own client (`build`)
>>> exporter.start(); ...; await exporter.stop()     # in a running service
>>> archived = await exporter.drain(); await exporter.close()   # or: what is there now
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, date, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from redis import exceptions as redis_errors

from gateway.ledger.archive.commit import LeaseLost
from gateway.ledger.archive.compact import MAX_ROWS, compact
from gateway.ledger.archive.lease import Claim
from gateway.ledger.archive.stream_export import ArchiveOptions, StreamExport, pause
from gateway.ledger.archive.worker import FileWorker
from gateway.redis_client import RedisClient

if TYPE_CHECKING:
    from gateway.metrics import ArchiveMetrics

log = logging.getLogger(__name__)

# Merged files per export turn: the exports of this process wait for them, so a large
# backlog (the first compaction of an old archive) is spread over many turns.
COMPACT_WRITES_PER_TURN = 2


class ArchiveBusy(Exception):
    """Another exporter holds a stream's lease (for `drain`, which does not wait long)."""


class ArchiveExporter:
    """`client` is closed by `close` (and `stop`) only when `owns_client`."""

    def __init__(
        self,
        client: RedisClient,
        streams: Sequence[str],
        root: Path,
        options: ArchiveOptions | None = None,
        metrics: ArchiveMetrics | None = None,
        stream_cap: int | None = None,
        *,
        owns_client: bool = False,
    ) -> None:
        self.root = root
        self.options = options or ArchiveOptions()
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.client = client
        self._owns_client = owns_client
        self._worker = FileWorker()
        self.streams = [
            StreamExport(client, key, root, self.options, self.token, self._worker)
            for key in streams
        ]
        self._metrics = metrics
        self._stopping = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._stats_due = dict.fromkeys(streams, 0.0)
        self._compacted: date | None = None  # the UTC day the closed days were compacted
        if metrics is not None and stream_cap is not None:
            for key in streams:
                metrics.stream_cap.labels(key).set(stream_cap)

    def start(self) -> None:
        """Export in the background until `stop` (needs a running loop)."""
        self._stopping.clear()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._export(stream)) for stream in self.streams]

    async def stop(self) -> None:
        """Finish the batch in hand (written and acked, or left pending for the next
        holder), hand the leases back, then `close`."""
        self._stopping.set()
        self._worker.halt()  # a commit waiting for the directory lock gives up
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await self.close()

    async def close(self) -> None:
        """End the file thread, and close the client if it is the exporter's own."""
        self._worker.close()
        if self._owns_client:
            self._owns_client = False  # closed once, whoever calls
            await self.client.aclose()

    async def drain(self, wait_s: float | None = None) -> int:
        """Archive every stream's entries up to now; returns how many were archived.
        Waits up to `wait_s` (default: a lease's ttl) for a stream another exporter holds,
        then raises `ArchiveBusy`."""
        wait_s = self.options.lease_ttl_s + 1 if wait_s is None else wait_s
        total = 0
        for stream in self.streams:
            try:
                caught_up = False
                while not caught_up:
                    if not stream.holding:
                        await self._wait_for_lease(stream, wait_s)
                        await stream.take_over()
                    tick = functools.partial(self._observe, stream)
                    try:
                        archived, caught_up = await stream.step(self._stopping, tick, drain=True)
                    except LeaseLost as exc:  # the batch is dropped; wait or take over again
                        log.warning("archiving %s: %s", stream.key, exc)
                        stream.holding = False
                        continue
                    total += self._count(stream, archived)
                await self._observe(stream, force=True)
            finally:
                stream.holding = False
                await stream.lease.release()
        return total

    async def _wait_for_lease(self, stream: StreamExport, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while not await stream.lease.claim():
            if time.monotonic() > deadline:
                owner = await stream.lease.owner()
                raise ArchiveBusy(f"{stream.key} is being exported by {owner}")
            await asyncio.sleep(self.options.poll_s)

    async def _export(self, stream: StreamExport) -> None:
        trouble = False
        try:
            while not self._stopping.is_set():
                try:
                    await self._turn(stream)
                    if trouble:
                        log.warning("archiving %s works again", stream.key)
                        trouble = False
                except LeaseLost as exc:
                    stream.holding = False
                    log.warning("archiving %s: %s", stream.key, exc)
                except Exception as exc:  # the gateway must outlive any failure here
                    stream.holding = False  # take over afresh: Redis may have lost the group
                    if self._stopping.is_set():
                        break  # e.g. a commit that gave up waiting for the lock
                    if not trouble:
                        unreachable = isinstance(exc, redis_errors.ConnectionError | OSError)
                        log.error(
                            "archiving %s failed (%s); retrying every %gs",
                            stream.key,
                            exc,
                            self.options.retry_s,
                            exc_info=not unreachable,
                        )
                        trouble = True
                    await pause(self._stopping, self.options.retry_s)
        finally:
            stream.holding = False
            with contextlib.suppress(Exception):
                await stream.lease.release()

    async def _turn(self, stream: StreamExport) -> None:
        """One batch while holding the lease; else one wait for it."""
        claim = await stream.lease.claim()
        if claim:
            # Taken afresh while we thought we held it: it lapsed, and another may have
            # claimed our entries meanwhile; take over again either way.
            if not stream.holding or claim is Claim.TAKEN:
                log.info("exporting %s to %s as %s", stream.key, self.root, self.token)
                await stream.take_over()
            tick = functools.partial(self._observe, stream)
            archived, _ = await stream.step(self._stopping, tick)
            self._count(stream, archived)
            if stream is self.streams[0]:
                await self._compact_closed_days()
        else:  # another holds it: ask again a few times per lease, not every poll
            stream.holding = False
            await pause(self._stopping, max(self.options.poll_s, self.options.lease_ttl_s / 10))
        await self._observe(stream)

    async def _compact_closed_days(self) -> None:
        """Merge the files of the days before today (`compact`), a few merges a turn, in
        the file thread, until none is left; then not again before the next UTC day. A
        failure is logged and tried the next day."""
        today = datetime.now(UTC).date()
        if not self.options.compact or self._compacted == today:
            return

        def keep_waiting() -> bool:  # a stopping exporter does not wait for the lock
            return not self._worker.stopping()

        try:
            done = await self._worker.run(
                compact, self.root, today, MAX_ROWS, keep_waiting, COMPACT_WRITES_PER_TURN
            )
        except Exception as exc:  # the export goes on; the files stay as they are
            log.error("compacting %s failed: %s", self.root, exc)
            self._compacted = today
            return
        if done.complete:
            self._compacted = today
        if done.written or done.superseded:
            log.info(
                "compacted %s: %d files into %d (%d rows)",
                self.root, done.merged, done.written, done.rows,
            )  # fmt: skip

    def _count(self, stream: StreamExport, archived: int) -> int:
        if self._metrics is not None and archived:
            self._metrics.archived.labels(stream.key).inc(archived)
        return archived

    async def _observe(self, stream: StreamExport, force: bool = False) -> None:
        """Refresh the backlog and dropped gauges every `stats_s` (holder or not)."""
        now = time.monotonic()
        if self._metrics is None or (not force and now < self._stats_due[stream.key]):
            return
        self._stats_due[stream.key] = now + self.options.stats_s
        try:
            stats = await stream.stats()
        except redis_errors.ResponseError:  # no group yet: nobody has exported it
            return
        self._metrics.backlog.labels(stream.key).set(stats.backlog)
        if stats.dropped is not None:
            self._metrics.dropped.labels(stream.key).set(stats.dropped)
